"""Test helper: a small MemWAL table with a vector column, a text column and IVF_PQ, FTS and BTREE indexes."""

from __future__ import annotations

import uuid

import lance
import numpy as np
import pyarrow as pa

from memwal.storage import lance_storage_options
from memwal.writer import RegionWriter

from support.maintenance import ONE_GEN_PER_FLUSH
from support.tables import PK

DIM = 16
SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False, metadata=PK),
    pa.field("text", pa.string()),
    pa.field("vec", pa.list_(pa.float32(), DIM)),
])
WORDS = ["apple", "river", "stone", "cloud", "ember", "maple", "quartz", "violet"]


def vectors(ids, version: int = 0) -> np.ndarray:
    """Deterministic vectors: a function of the id and the row's version (an upsert changes it)."""
    return np.stack([np.random.default_rng(i * 7919 + version).standard_normal(DIM).astype("float32") for i in ids]) \
        if len(ids) else np.zeros((0, DIM), "float32")


def text_of(i: int, version: int = 0) -> str:
    return f"{WORDS[i % len(WORDS)]} {WORDS[(i // 8 + version) % len(WORDS)]} doc{i}v{version}"


def vector_rows(ids, version: int = 0) -> pa.Table:
    ids = list(ids)
    flat = pa.array(vectors(ids, version).ravel(), pa.float32())
    return pa.table({"id": pa.array(ids, pa.int64()), "text": [text_of(i, version) for i in ids],
                     "vec": pa.FixedSizeListArray.from_arrays(flat, DIM)}, schema=SCHEMA)


def create_vector_table(loc, rows: int = 3000, regions: int = 1) -> list[str]:
    """A base table of `rows` rows with IVF_PQ (4 partitions), INVERTED and BTREE indexes, MemWAL initialised
    maintaining all of them; returns region ids (writers are opened by `write_generation`)."""
    opts = lance_storage_options(loc.storage_options)
    ds = lance.write_dataset(vector_rows(range(rows)), loc.uri, storage_options=opts)
    ds.create_index("vec", "IVF_PQ", name="vec_idx", num_partitions=4, num_sub_vectors=4)
    ds.create_scalar_index("text", "INVERTED", name="text_idx")
    ds.create_scalar_index("id", "BTREE", name="id_idx")
    lance.dataset(loc.uri, storage_options=opts).initialize_mem_wal(unsharded=True)
    return [str(uuid.uuid4()) for _ in range(regions)]


def write_generation(loc, region: str, ids, version: int, delete_ids=()) -> None:
    """One flushed generation: upserts of `ids` at `version`, then deletes."""
    with RegionWriter(loc.uri, region, storage_options=loc.storage_options, config=ONE_GEN_PER_FLUSH) as w:
        w.put(vector_rows(ids, version))
        if delete_ids:
            w.delete(pa.table({"id": pa.array(list(delete_ids), pa.int64())}))
        w.flush()
