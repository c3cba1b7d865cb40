"""Region spec transforms (memwal-spec.txt "Region Spec"): evaluate a spec on rows (the region field
values) and route rows to regions. Bucket hashing reproduces Lance core (pylance 14
`lance.mem_wal.evaluate_sharding_spec`) bit for bit."""

from __future__ import annotations

import datetime
import zoneinfo
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.errors import RegionSpecError
from memwal.field_ids import column_names, resolve_column
from memwal.murmur3 import hash_into
from memwal.region_spec import DATE_PARTS, I32_MAX, INT32_RESULT, RegionField, RegionSpec

__all__ = ["evaluate", "route"]


def _result_arrow_type(fld: RegionField) -> pa.DataType:
    if fld.transform in INT32_RESULT:
        return pa.int32()
    try:
        return pa.type_for_alias(fld.result_type)
    except (ValueError, KeyError):
        return pa.null()


def _valid_mask(arr: pa.Array) -> np.ndarray | None:
    return None if arr.null_count == 0 else ~arr.is_valid().to_numpy(zero_copy_only=False)


_EPOCH = datetime.datetime(1970, 1, 1)
_SECONDS_MIN = -62135596800 + 86400  # 0001-01-02: within Python's datetime range
_CHRONO_TZ_END = 4102444800  # 2100-01-01 UTC
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def _utc_offsets(seconds: np.ndarray, zone: zoneinfo.ZoneInfo) -> np.ndarray:
    """UTC offset (seconds) at each instant, as DataFusion's chrono-tz sees it: the zone's rules up to
    2100-01-01 UTC, then frozen at the last offset (chrono-tz tables end in 2099; measured)."""

    def offset(s: int) -> int:
        s = min(max(s, _SECONDS_MIN), _CHRONO_TZ_END - 1)
        local = zone.fromutc((_EPOCH + datetime.timedelta(seconds=s)).replace(tzinfo=zone))
        return int(local.utcoffset().total_seconds())  # type: ignore[union-attr]

    quarters, inverse = np.unique(seconds // 900, return_inverse=True)  # offsets change rarely
    start = np.array([offset(int(q) * 900) for q in quarters], np.int64)
    end = np.array([offset(int(q) * 900 + 899) for q in quarters], np.int64)
    out = start[inverse]
    for i in np.flatnonzero((start != end)[inverse]):  # a transition inside the quarter hour
        out[i] = offset(int(seconds[i]))
    return out


def _local_time(arr: pa.Array) -> pa.Array:
    """A tz-aware timestamp array as naive local wall-clock time.

    pyarrow's own conversion stops applying DST after 2037 (its tz database reader ignores the rule
    that continues the table), while DataFusion applies it until 2100, so named zones go through
    zoneinfo. Fixed offsets ("+05:30") are exact in pyarrow.
    """
    t = arr.type
    try:
        zone = zoneinfo.ZoneInfo(t.tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return pc.local_timestamp(arr)
    raw = arr.view(pa.int64()).fill_null(0).to_numpy()
    per = _PER_SECOND[t.unit]
    local = raw + _utc_offsets(raw // per, zone) * per
    return pa.array(local, pa.timestamp(t.unit), mask=_valid_mask(arr))


def _date_part(fld: RegionField, arr: pa.Array) -> pa.Array:
    """DataFusion's date_part(part, col0) as int32; tz-aware timestamps use local time, as DataFusion."""
    part = str(fld.transform)
    t = arr.type
    if pa.types.is_date64(t):
        arr, t = arr.view(pa.timestamp("ms")), pa.timestamp("ms")
    if pa.types.is_timestamp(t) and t.tz:
        arr = _local_time(arr)
    if pa.types.is_date32(t) and part == "hour":
        return pa.array(np.zeros(len(arr), np.int32), mask=_valid_mask(arr))
    if not (pa.types.is_date32(t) or pa.types.is_timestamp(t)):
        raise RegionSpecError(
            f"region field {fld.field_id!r}: transform {part!r} needs a date or timestamp "
            f"source column, got {t}"
        )
    return getattr(pc, part)(arr).cast(pa.int32())


def _truncate(fld: RegionField, arr: pa.Array) -> pa.Array:
    """left(col0, W) for strings (W characters); col0 - (col0 % W) for numbers, % truncating toward zero
    (DataFusion / Rust semantics: truncate(-7, 5) = -5, not Iceberg's floor -10)."""
    w = fld.width
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pc.utf8_slice_codeunits(arr, 0, w)
    if pa.types.is_string_view(t):
        return pc.utf8_slice_codeunits(arr.cast(pa.large_string()), 0, w).cast(t)
    mask = _valid_mask(arr)
    if pa.types.is_integer(t):
        v = arr.fill_null(0).to_numpy()
        wide = np.uint64 if t == pa.uint64() else np.int64
        vw = v.astype(wide)
        out = vw - np.fmod(vw, wide(w))  # |out| <= |v|: always fits the source type
        return pa.array(out.astype(v.dtype), type=t, mask=mask)
    if pa.types.is_floating(t) and t.bit_width in (32, 64):
        v = arr.fill_null(0).to_numpy()
        with np.errstate(invalid="ignore"):
            out = v - np.fmod(v, v.dtype.type(w))
        return pa.array(out, type=t, mask=mask)
    raise RegionSpecError(
        f"region field {fld.field_id!r}: transform 'truncate' needs a string or numeric "
        f"source column, got {t}"
    )


def apply_transform(fld: RegionField, cols: list[pa.Array | None], n: int) -> pa.Array:
    """Evaluate one region field over resolved source columns (None: column absent, i.e. all NULL)."""
    if fld.expression is not None:
        raise RegionSpecError(
            f"region field {fld.field_id!r} uses expression {fld.expression!r}: DataFusion SQL region "
            "expressions cannot be evaluated by this library (only the well-known transforms can)"
        )
    t = fld.transform
    if t == "unsharded":
        return pa.array(np.zeros(n, np.int32))
    try:
        if t in ("bucket", "multi_bucket"):
            seed = np.zeros(n, np.uint32)
            hashed = cols if t == "multi_bucket" else cols[:1]  # Lance core: bucket hashes col0 only
            for c in hashed:
                seed = hash_into(c, seed)
            out = ((seed & np.uint32(I32_MAX)) % np.uint32(fld.num_buckets)).astype(np.int32)
            if t == "bucket":
                return pa.array(out)  # Lance core: NULL -> hash = seed 0 -> bucket 0 (spec says NULL)
            all_null = np.ones(n, bool)
            for c in hashed:
                if c is not None:
                    all_null &= ~c.is_valid().to_numpy(zero_copy_only=False)
            return pa.array(out, mask=all_null if all_null.any() else None)
    except TypeError as e:
        raise RegionSpecError(f"region field {fld.field_id!r}: transform {t!r}: {e}") from None
    col = cols[0]
    if col is None:
        return pa.nulls(n, _result_arrow_type(fld))
    if t == "identity":
        return col
    if t in DATE_PARTS:
        return _date_part(fld, col)
    return _truncate(fld, col)


def _as_table(table_or_batch: pa.Table | pa.RecordBatch) -> pa.Table:
    if isinstance(table_or_batch, pa.RecordBatch):
        return pa.Table.from_batches([table_or_batch])
    return table_or_batch


def evaluate(
    spec: RegionSpec, table_or_batch: pa.Table | pa.RecordBatch, source_names: Mapping[int, str]
) -> pa.Table:
    """One column `region_field_{field_id}` per spec field, row-aligned with the input.

    `source_names` maps source field id -> column name (see source_names_from_schema). An id missing
    from it raises RegionSpecError; a named column missing from the batch is read as all NULL (spec:
    "column removal resistant"; Lance core raises instead). Differences from the spec text, following
    Lance core: bucket is (murmur3 & 0x7FFFFFFF) % N, not abs(murmur3) % N, and bucket(NULL) is 0, not NULL.
    """
    table = _as_table(table_or_batch)
    n = table.num_rows
    names, arrays = [], []
    for fld in spec.fields:
        if fld.expression is not None:
            apply_transform(fld, [], n)  # raises, naming the field
        cols = [resolve_column(table, name) for name in column_names(fld, source_names)]
        names.append(fld.column_name)
        arrays.append(apply_transform(fld, cols, n))
    return pa.table(arrays, names=names)


def route(
    spec: RegionSpec, batch: pa.Table | pa.RecordBatch, source_names: Mapping[int, str]
) -> dict[tuple, pa.Table]:
    """Group the rows of a batch by region value tuple (one value per spec field, in spec order).

    Every row lands in exactly one group and rows keep their relative order inside a group.
    """
    table = _as_table(batch)
    n = table.num_rows
    if n == 0:
        return {}
    regions = evaluate(spec, table, source_names)
    key = np.zeros(n, np.int64)
    dictionaries: list[tuple[pa.Array, np.ndarray]] = []
    for col in regions.columns:
        arr = col.combine_chunks()
        if pa.types.is_null(arr.type):
            dictionary, codes = pa.nulls(1), np.zeros(n, np.int64)
        else:
            enc = pc.dictionary_encode(arr, null_encoding="encode")
            dictionary, codes = enc.dictionary, enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        size = max(len(dictionary), 1)
        if key.max(initial=0) > (2**62) // size:  # compact before the mixed-radix key could overflow
            key = np.unique(key, return_inverse=True)[1].astype(np.int64)
        key = key * size + codes
        dictionaries.append((dictionary, codes))
    _, first, inverse, counts = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
    order = np.argsort(inverse, kind="stable")
    ordered = table.take(pa.array(order))
    out: dict[tuple, pa.Table] = {}
    start = 0
    for row, count in zip(first.tolist(), counts.tolist(), strict=True):
        value = tuple(dictionary[int(codes[row])].as_py() for dictionary, codes in dictionaries)
        out[value] = ordered.slice(start, count)
        start += count
    return out
