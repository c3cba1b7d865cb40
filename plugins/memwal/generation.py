"""Flushed generations: a MemTable written as a Lance table at _mem_wal/{region}/{8 hex}_gen_{i}/.

The data (with `_tombstone`) holds every put in WAL order; rows a later put of the same key supersedes
within the generation are masked by a deletion vector, as Lance core's flush leaves them. Lance core's LSM
reader needs `_pk_index/` (a BTREE index on the primary key, over every row: page_lookup.lance and
page_data.lance). Its LSM vector and FTS planners search a generation
only through the base table's maintained indexes built on it (memwal.generation_indexes), and readers
skip generations by `bloom_filter.bin` (memwal.bloom_filter, Lance core's bytes). Everything is written
into a fresh directory before the region manifest commit, so a crash in between leaves nothing visible.
"""

from __future__ import annotations

import secrets

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.fragment import DeletionFile

from memwal import naming
from memwal.bloom_filter import write_bloom_filter
from memwal.errors import MissingGenerationError
from memwal.generation_indexes import MaintainedIndex, build_generation_indexes
from memwal.storage import ObjectStore, lance_storage_options

__all__ = ["open_generation", "write_generation"]

_PK_INDEX_FILES = ("page_lookup.lance", "page_data.lance")
_DELETION_SCHEMA = pa.schema([pa.field("row_id", pa.uint32(), nullable=False)])


def write_generation(
    store: ObjectStore,
    region_id: str,
    generation: int,
    table: pa.Table,
    pk_columns: list[str],
    indexes: list[MaintainedIndex] | None = None,
    superseded: np.ndarray | None = None,
) -> str:
    """Write rows (with _tombstone), the key index, the maintained indexes and the bloom filter as a new
    generation directory; returns its name. `superseded`: positions in `table` masked by a deletion vector
    (older puts of a key written again within the generation); `_pk_index`, the maintained indexes and the bloom
    filter are built over every row, before the mask (Lance applies it when they are searched).

    The directory name is fresh on every call, so a retried flush never collides with a failed one.
    """
    dir_name = naming.new_generation_dir_name(generation)
    rel = naming.generation_dir(region_id, dir_name)
    uri = store.uri_of(rel)
    opts = lance_storage_options(store.storage_options)
    ds = lance.write_dataset(table, uri, mode="create", storage_options=opts)
    if len(pk_columns) == 1 and table.num_rows:
        ds.create_scalar_index(pk_columns[0], "BTREE")
        index = next(i for i in ds.describe_indices() if i.fields)
        for name in _PK_INDEX_FILES:
            data = store.get(f"{rel}/_indices/{index.segments[0].uuid}/{name}")
            store.put(f"{rel}/{naming.PK_INDEX_DIR}/{name}", data)
    if indexes and table.num_rows:
        ds = build_generation_indexes(ds, table, indexes)
    if superseded is not None and len(superseded):
        ds = _mask_rows(store, rel, ds, superseded)
    # the distinct keys: a key written twice sets the same bits (the bytes are the same), hashed once
    key = pc.unique(table.column(pk_columns[0])) if len(pk_columns) == 1 else pa.array([None], pa.null())
    write_bloom_filter(store, region_id, dir_name, key)
    return dir_name


def _mask_rows(store: ObjectStore, rel: str, ds: lance.LanceDataset, positions: np.ndarray) -> lance.LanceDataset:
    """Mask the rows at these positions of the written order: per fragment an Arrow deletion file (Lance's
    format: one non-null UInt32 column `row_id` of row offsets, at `_deletions/{fragment}-{read version}-{id}
    .arrow`), committed as one Lance Delete. Lance's `delete(predicate)` would parse an `_rowaddr IN (...)`
    list: 4.7 s for 500k rows, against 0.04 s here."""
    updated, start = [], 0
    for fragment in ds.get_fragments():
        meta = fragment.metadata
        mine = positions[(positions >= start) & (positions < start + meta.physical_rows)] - start
        start += meta.physical_rows
        if not len(mine):
            continue
        file_id = secrets.randbits(63)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, _DELETION_SCHEMA) as writer:
            writer.write_table(pa.table({"row_id": pa.array(mine.astype(np.uint32))}, schema=_DELETION_SCHEMA))
        store.put(f"{rel}/_deletions/{meta.id}-{ds.version}-{file_id}.arrow", sink.getvalue().to_pybytes())
        meta.deletion_file = DeletionFile(ds.version, file_id, "array", len(mine), None)
        updated.append(meta)
    op = lance.LanceOperation.Delete(updated, [], "rows a later put of the key supersedes within the generation")
    return lance.LanceDataset.commit(ds.uri, op, read_version=ds.version,
                                     storage_options=lance_storage_options(store.storage_options))


def open_generation(
    store: ObjectStore, region_id: str, generation: int, dir_name: str
) -> lance.LanceDataset:
    """Open a flushed generation; MissingGenerationError names it if it is missing or unreadable."""
    rel = naming.generation_dir(region_id, dir_name)
    uri = store.uri_of(rel)
    try:
        return lance.dataset(uri, storage_options=lance_storage_options(store.storage_options))
    except (OSError, ValueError) as exc:
        raise MissingGenerationError(region_id, generation, uri, str(exc).splitlines()[0]) from exc
