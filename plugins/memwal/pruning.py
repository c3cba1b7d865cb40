"""Region pruning (memwal-spec.txt "Region Pruning"): which regions may hold rows matching simple
predicates, from each region's field values."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from memwal.errors import RegionSpecError
from memwal.field_ids import column_names
from memwal.region_spec import RegionField, RegionSpec
from memwal.transforms import apply_transform

__all__ = ["prune"]

_MAX_COMBINATIONS = 4096


def _schema_type(schema: pa.Schema | None, name: str) -> pa.DataType | None:
    if schema is None:
        return None
    idx = schema.get_field_index(name)
    if idx >= 0:
        return schema.field(idx).type
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        idx = schema.get_field_index(".".join(parts[:cut]))
        if idx < 0:
            continue
        t = schema.field(idx).type
        for part in parts[cut:]:
            if not pa.types.is_struct(t) or t.get_field_index(part) < 0:
                return None
            t = t.field(t.get_field_index(part)).type
        return t
    return None


_NUMERIC = (pa.int32(), pa.uint32(), pa.int64(), pa.uint64(), pa.float32(), pa.float64())


def _literal_types(values: Sequence[Any]) -> list[pa.DataType] | None:
    """Candidate column types for untyped literals. Hashes differ between 32- and 64-bit and between
    integer and float types, so a number is tried as each (narrower integers hash like int32); a literal
    a type cannot hold exactly is skipped for that type. Pruning must only ever keep too much."""
    kinds = {type(v) for v in values if v is not None}
    if kinds <= {int, float}:
        return list(_NUMERIC)
    if kinds <= {str}:
        return [pa.string()]
    if kinds <= {bool}:
        return [pa.bool_()]
    return None


def _typed_candidates(values: Sequence[Any], typ: pa.DataType | None) -> list[pa.Array] | None:
    types = [typ] if typ is not None else _literal_types(values)
    if types is None:
        return None
    out = []
    for t in types:
        kept = []
        for v in values:
            try:  # a literal that does not fit this type cannot be a value of this column type
                kept.append(pa.array([v]).cast(t) if v is not None else pa.nulls(1, t))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OverflowError):
                if typ is not None:
                    return None  # the caller's column type does not take this literal: do not prune
        if kept:
            out.append(pa.concat_arrays(kept))
    return out


def _norm(v: Any) -> Any:
    return "\x00NaN" if isinstance(v, float) and math.isnan(v) else v


def _kind(v: Any) -> type:
    return float if isinstance(v, int | float) else type(v)  # bool, int and float compare as numbers


def _may_match(value: Any, possible: set[Any] | None) -> bool:
    if possible is None or _norm(value) in possible:
        return True
    # A region value of another kind than the computed ones (say a date against string literals, when
    # no schema gave the column type) proves nothing: keep the region.
    return value is not None and bool(possible) and _kind(value) not in {_kind(p) for p in possible}


def _possible_values(
    fld: RegionField,
    predicates: Mapping[str, Sequence[Any]],
    source_names: Mapping[int, str],
    schema: pa.Schema | None,
) -> set[Any] | None:
    """The region values rows matching the predicates can have for this field, or None if unknown."""
    if fld.expression is not None or fld.transform == "unsharded":
        return None
    try:
        names = column_names(fld, source_names)
    except RegionSpecError:
        return None
    if fld.transform != "multi_bucket":
        names = names[:1]
    if not names or any(name not in predicates for name in names):
        return None
    per_column = []
    for name in names:
        cands = _typed_candidates(list(predicates[name]), _schema_type(schema, name))
        if cands is None:
            return None
        per_column.append(cands)
    possible: set[Any] = set()
    for typed in itertools.product(*per_column):
        sizes = [len(a) for a in typed]
        if math.prod(sizes) > _MAX_COMBINATIONS:
            return None
        if math.prod(sizes) == 0:
            continue
        grids = np.meshgrid(*[np.arange(s) for s in sizes], indexing="ij")
        cols = [a.take(pa.array(g.ravel())) for a, g in zip(typed, grids, strict=True)]
        try:
            result = apply_transform(fld, cols, len(cols[0]))
        except (RegionSpecError, pa.ArrowException):
            return None
        possible.update(_norm(v) for v in result.to_pylist())
    return possible


def prune(
    spec: RegionSpec,
    predicates: Mapping[str, Sequence[Any]],
    source_names: Mapping[int, str],
    region_values: Mapping[str, tuple],
    *,
    schema: pa.Schema | None = None,
) -> set[str]:
    """Region ids that may hold rows matching `predicates` ({column: allowed values}, ANDed).

    A region is dropped only if some spec field is determined by the predicates and the region's value
    for it is not among the possible ones. `schema` (the table's Arrow schema) gives literal types; without
    it, integer / float literals are tried as every width (bucket hashes differ by width) and strings as
    strings, so pass `schema` whenever a spec column is temporal (a bucket of `ts = '2024-01-01'` can
    only be computed knowing the column's unit and time zone).
    """
    possible = [_possible_values(f, predicates, source_names, schema) for f in spec.fields]
    return {
        region_id
        for region_id, values in region_values.items()
        if len(values) != len(spec.fields)
        or all(_may_match(v, p) for v, p in zip(values, possible, strict=True))
    }
