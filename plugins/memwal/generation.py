"""Flushed generations: a MemTable written as a Lance table at _mem_wal/{region}/{8 hex}_gen_{i}/.

Besides the data (with `_tombstone`), Lance core's LSM reader needs `_pk_index/` (a BTREE index on the
primary key: page_lookup.lance and page_data.lance). `bloom_filter.bin` is optional for Lance core's
reader and its byte format is not specified, so we do not write one.
"""

from __future__ import annotations

import lance
import pyarrow as pa

from memwal import naming
from memwal.errors import MissingGenerationError
from memwal.storage import ObjectStore, lance_storage_options

__all__ = ["open_generation", "write_generation"]

_PK_INDEX_FILES = ("page_lookup.lance", "page_data.lance")


def write_generation(
    store: ObjectStore, region_id: str, generation: int, table: pa.Table, pk_columns: list[str]
) -> str:
    """Write rows (with _tombstone) as a new generation directory; returns its name.

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
    return dir_name


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
