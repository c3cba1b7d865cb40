"""Source field ids -> column names: how a region spec's source field ids resolve to the columns of a
table (Lance core's field id assignment, or the ids Arrow field metadata carries)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from memwal.errors import RegionSpecError
from memwal.region_spec import RegionField

__all__ = ["FIELD_ID_METADATA", "source_names_from_schema"]

# Arrow field metadata key under which Lance core hands out field ids (WAL entries carry it).
FIELD_ID_METADATA = b"lance:field_id"


def _lance_children(f: pa.Field) -> list[pa.Field]:
    """The children Lance gives field ids to (measured on pylance 14, LanceSchema.from_pyarrow)."""
    t = f.type
    if pa.types.is_struct(t):
        return [t.field(i) for i in range(t.num_fields)]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [t.value_field]
    if pa.types.is_map(t):
        return [pa.field("entries", pa.struct([t.key_field, t.item_field]))]
    if pa.types.is_fixed_size_list(t) and pa.types.is_struct(t.value_type):
        return [t.value_field]  # a fixed_size_list of primitives is one leaf; of structs it has children
    return []


def source_names_from_schema(schema: pa.Schema) -> dict[int, str]:
    """Map Lance field id -> column name, as Lance core resolves source_ids (nested: dotted "parent.child").

    Field ids come from the `lance:field_id` field metadata when any field carries it (WAL entries do, on
    nested children too; `_tombstone` does not). Otherwise ids are assigned as Lance assigns them to a
    fresh table: depth-first pre-order over ALL fields, nested ones included (struct children, list
    items, map entries/key/value, children of fixed_size_list<struct>), so with a struct column the
    top-level position is NOT the field id (measured: schema (a, s{x}, b) gives a=0, s=1, s.x=2, b=3).
    """
    out: dict[int, str] = {}

    def walk_meta(f: pa.Field, prefix: str) -> bool:
        found = False
        name = prefix + f.name
        raw = (f.metadata or {}).get(FIELD_ID_METADATA)
        if raw is not None:
            try:
                out[int(raw)] = name
                found = True
            except ValueError:
                pass
        for c in _lance_children(f):
            found = walk_meta(c, name + ".") or found
        return found

    if any([walk_meta(f, "") for f in schema]):
        return out
    out.clear()
    counter = itertools.count()

    def walk(f: pa.Field, prefix: str) -> None:
        out[next(counter)] = prefix + f.name
        for c in _lance_children(f):
            walk(c, prefix + f.name + ".")

    for f in schema:
        walk(f, "")
    return out


def column_names(fld: RegionField, source_names: Mapping[int, str]) -> list[str]:
    col = fld._column_param()
    if col is not None:
        return [col]
    names = []
    for sid in fld.source_ids:
        if sid not in source_names:
            raise RegionSpecError(
                f"region field {fld.field_id!r}: source field id {sid} is not in the schema "
                f"(known ids: {sorted(source_names)})"
            )
        names.append(source_names[sid])
    return names


def resolve_column(table: pa.Table, name: str) -> pa.Array | None:
    """A column by name; a dotted name also reaches into struct columns. None when absent."""
    idx = table.schema.get_all_field_indices(name)
    if idx:
        return table.column(idx[0]).combine_chunks()
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:cut])
        idx = table.schema.get_all_field_indices(head)
        if not idx:
            continue
        arr: pa.Array = table.column(idx[0]).combine_chunks()
        for part in parts[cut:]:
            if not pa.types.is_struct(arr.type) or arr.type.get_field_index(part) < 0:
                return None
            arr = pc.struct_field(arr, [arr.type.get_field_index(part)])
        return arr
    return None
