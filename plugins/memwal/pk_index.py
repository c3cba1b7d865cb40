"""A generation's `_pk_index/`: a BTREE over its primary key (every row, in written order), as Lance core writes it.

A one-column key is indexed as the column itself. A composite key is indexed as one binary value per row, the
order-preserving encoding Lance core's flush uses (read off files pylance 14 wrote): per key column a 0x01
(not null) byte, then an integer as 8 big-endian bytes of the value as int64 with the sign bit flipped, or a
string or binary value with each 0x00 byte written 0x00 0xFF and a 0x00 0x00 terminator.
"""

from __future__ import annotations

import logging
import tempfile

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal import naming
from memwal.storage import ObjectStore

__all__ = ["composite_key_values", "write_pk_index"]

log = logging.getLogger(__name__)

_PK_INDEX_FILES = ("page_lookup.lance", "page_data.lance")
_NOT_NULL = pa.scalar(b"\x01", pa.binary())
_TERMINATOR = pa.scalar(b"\x00\x00", pa.binary())
_EMPTY = pa.scalar(b"", pa.binary())


def _encode_column(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """One key column as order-preserving bytes (without the not-null marker)."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    t = column.type
    if pa.types.is_signed_integer(t):
        flipped = column.cast(pa.int64()).to_numpy(zero_copy_only=False).view(np.uint64) ^ np.uint64(1 << 63)
        raw = flipped.astype(">u8").tobytes()
        return pa.FixedSizeBinaryArray.from_buffers(pa.binary(8), len(column), [None, pa.py_buffer(raw)]).cast(
            pa.binary())
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        escaped = pc.replace_substring(column.cast(pa.binary()), b"\x00", b"\x00\xff")
        return pc.binary_join_element_wise(escaped, _TERMINATOR, _EMPTY)
    raise TypeError(f"no order-preserving key encoding for type {t}")


def composite_key_values(table: pa.Table, pk_columns: list[str]) -> pa.Array:
    """Each row's composite key as the binary value Lance core's `_pk_index` holds for it."""
    parts = []
    for name in pk_columns:
        parts += [_NOT_NULL, _encode_column(table.column(name))]
    return pc.binary_join_element_wise(*parts, _EMPTY)


def write_pk_index(store: ObjectStore, rel: str, ds: lance.LanceDataset, table: pa.Table,
                   pk_columns: list[str]) -> None:
    """Build the BTREE over the key (`table` is the generation's rows in written order) and copy its two files
    to `{rel}/_pk_index/`. A composite key of a type with no known encoding gets none, with a warning: our
    readers do not need it; Lance core's LSM scanner refuses such a generation."""
    if not table.num_rows:
        return
    if len(pk_columns) == 1:
        source, column = ds, pk_columns[0]
        _copy_index_files(store, rel, source, column, lambda p: store.get(f"{rel}/{p}"))
        return
    try:
        values = composite_key_values(table, pk_columns)
    except TypeError as exc:
        log.warning("%s: no %s for the composite key %s (%s); Lance core's LSM scanner cannot read this "
                    "generation, ours can", rel, naming.PK_INDEX_DIR, pk_columns, exc)
        return
    # Lance builds the BTREE on a one-column table of the encoded keys, same row order, so the same row ids.
    with tempfile.TemporaryDirectory(prefix="memwal-pk-") as tmp:
        keys = lance.write_dataset(pa.table({"values": values}), tmp)
        _copy_index_files(store, rel, keys, "values", lambda p: _read_local(f"{tmp}/{p}"))


def _read_local(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _copy_index_files(store: ObjectStore, rel: str, ds: lance.LanceDataset, column: str, read) -> None:
    ds.create_scalar_index(column, "BTREE")
    index = next(i for i in ds.describe_indices() if i.field_names == [column])
    for name in _PK_INDEX_FILES:
        data = read(f"_indices/{index.segments[0].uuid}/{name}")
        store.put(f"{rel}/{naming.PK_INDEX_DIR}/{name}", data)
