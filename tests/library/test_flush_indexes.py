"""Our flush builds the base table's maintained indexes and Lance core's bloom_filter.bin on each generation,
so Lance core's LSM vector search planner finds the rows our writer flushed."""

from __future__ import annotations

import uuid
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
from lance.mem_wal import LsmVectorSearchPlanner

from memwal.bloom_filter import BloomFilter, read_bloom_filter
from memwal.naming import BLOOM_FILTER_FILE, MEM_WAL_DIR
from memwal.storage import ObjectStore
from memwal.writer import RegionWriter, WriterConfig

from support.tables import lance_core_snapshots

DIM = 8
PK = {"lance-schema:unenforced-primary-key": "true"}
SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False, metadata=PK),
    pa.field("text", pa.string()),
    pa.field("vec", pa.list_(pa.float32(), DIM)),
])


def _rows(ids, offset: float, word: str) -> pa.Table:
    ids = list(ids)
    flat = np.concatenate([np.full(DIM, offset + i / 1000, dtype=np.float32) for i in ids]) if ids else []
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "text": [f"{word} doc {i}" for i in ids],
        "vec": pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), DIM),
    }, schema=SCHEMA)


def _table_with_indexes(uri: str) -> None:
    rng = np.random.default_rng(7)
    base = _rows(range(300), 0.0, "base")
    vec = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(300 * DIM, dtype=np.float32)), DIM)
    ds = lance.write_dataset(base.set_column(2, "vec", vec), uri)
    ds.create_index("vec", "IVF_PQ", name="vidx", num_partitions=2, num_sub_vectors=2)
    ds.create_scalar_index("text", "INVERTED", name="fts", with_position=False, stem=False)
    lance.dataset(uri).initialize_mem_wal(unsharded=True, maintained_indexes=["vidx", "fts"])


def test_flushed_generations_carry_maintained_indexes_and_bloom_filter(tmp_path):
    """
    base: 300 rows, IVF_PQ "vidx" and INVERTED "fts" maintained | gens: keys 1000..1039 (two flushes)
    every generation must hold both indexes under the base's names and the bloom filter over its keys.
    """
    uri = str(tmp_path / "t")
    _table_with_indexes(uri)
    region = str(uuid.uuid4())
    with RegionWriter(uri, region, config=WriterConfig(max_memtable_rows=20, max_flush_interval_s=None)) as w:
        w.put(_rows(range(1000, 1020), 10.0, "fresh"))
        w.put(_rows(range(1020, 1040), 10.0, "fresh"))
        w.delete(pa.table({"id": pa.array([1000], pa.int64())}))
    gens = sorted(p.parent for p in Path(uri, MEM_WAL_DIR).glob("*/*_gen_*/_versions"))
    assert len(gens) == 3, "the scenario must flush two generations of puts and one of deletes"
    store = ObjectStore(uri)
    for gen in gens:
        ds = lance.dataset(str(gen))
        indexes = {d.name: (d.index_type, d.field_names) for d in ds.describe_indices()}
        has_vectors = ds.count_rows("vec IS NOT NULL") > 0
        want = ("IVF_FLAT", ["vec"]) if has_vectors else None  # a deletes-only generation has none to index
        assert indexes.get("vidx") == want, f"{gen.name}: vector index not maintained as specified"
        assert indexes.get("fts", (None,))[0] == "Inverted", f"{gen.name}: FTS index not maintained"
        keys = ds.to_table(columns=["id"]).column("id")
        assert (gen / BLOOM_FILTER_FILE).read_bytes() == BloomFilter.from_keys(keys).to_bytes()
        assert read_bloom_filter(store, gen.parent.name, gen.name).might_contain(keys).all()
    fts_params = {d.name: d.details for d in lance.dataset(str(gens[0])).describe_indices()}["fts"]
    assert fts_params["stem"] is False and fts_params["with_position"] is False, "base tokenizer params lost"


def test_lance_core_vector_search_finds_rows_our_writer_flushed(tmp_path):
    """
    base: 300 random vectors near 0..1 | gens: keys 1000..1039 at 10.0+, key 1000 then deleted
    Lance core's planner, queried at 10.0, must return 10 live generation rows, none deleted, no key twice.
    """
    uri = str(tmp_path / "t")
    _table_with_indexes(uri)
    with RegionWriter(uri, str(uuid.uuid4()),
                      config=WriterConfig(max_memtable_rows=20, max_flush_interval_s=None)) as w:
        w.put(_rows(range(1000, 1020), 10.0, "fresh"))
        w.put(_rows(range(1020, 1040), 10.0, "fresh"))
        w.delete(pa.table({"id": pa.array([1000], pa.int64())}))
    planner = LsmVectorSearchPlanner(lance.dataset(uri), lance_core_snapshots_of(uri), "vec")
    query = pa.array(np.full(DIM, 10.0, dtype=np.float32))
    ids = planner.plan_search(query, k=10, overfetch_factor=5.0).to_table().column("id").to_pylist()
    assert len(ids) == 10, f"short result {ids}: a generation was planned without its vector index"
    assert len(set(ids)) == 10, f"a key came back twice: {ids}"
    assert 1000 not in ids, "the deleted key came back"
    assert set(ids) <= set(range(1001, 1040)), f"generation rows nearest the query are missing: {ids}"


def lance_core_snapshots_of(uri: str):
    from types import SimpleNamespace

    return lance_core_snapshots(SimpleNamespace(kind="local", uri=uri, storage_options=None))


def test_maintain_all_indexes_builds_scalar_indexes_of_the_base_type(tmp_path):
    """
    base: BITMAP "tag_idx" on text, BTREE "id_idx" on the key; MemWAL with maintain_all_indexes
    a generation must carry tag_idx as a BITMAP on text; the key's BTREE stays the `_pk_index` source.
    """
    from memwal.mem_wal_index import initialize_mem_wal

    uri = str(tmp_path / "t")
    ds = lance.write_dataset(_rows(range(50), 0.0, "base"), uri)
    ds.create_scalar_index("text", "BITMAP", name="tag_idx")
    ds.create_scalar_index("id", "BTREE", name="id_idx")
    initialize_mem_wal(uri, None, None, maintained_indexes=None)
    with RegionWriter(uri, str(uuid.uuid4()), config=WriterConfig(max_flush_interval_s=None)) as w:
        w.put(_rows(range(40, 60), 1.0, "fresh"))
    [gen] = [p.parent for p in Path(uri, MEM_WAL_DIR).glob("*/*_gen_*/_versions")]
    indexes = {d.name: (d.index_type, d.field_names) for d in lance.dataset(str(gen)).describe_indices()}
    assert indexes["tag_idx"] == ("Bitmap", ["text"]), f"maintain_all_indexes must build tag_idx: {indexes}"
    assert indexes["id_idx"] == ("BTree", ["id"])
    assert (gen / "_pk_index" / "page_lookup.lance").exists()
