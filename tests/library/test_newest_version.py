"""The read plan's newest-version check (memwal.newest_version): base candidates are checked against the
generations above them through each generation's bloom filter first, then the keys above the base; a generation
with no bloom filter (or a corrupt one) counts as "maybe"; whole-base questions join the keys."""

from __future__ import annotations

import logging
import math
import os
import uuid
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from memwal.bloom_filter import NUM_BLOCKS, BloomFilter, bloom_filter_path
from memwal.naming import BLOOM_FILTER_FILE, MEM_WAL_DIR
from memwal.newest_version import shadowed_in_bulk
from memwal.reader import LsmReader
from memwal.table import MemWalTable
from memwal.writer import RegionWriter

from support.maintenance import flush_generation
from support.vector_model import (
    DIM,
    IVF_PQ_PARAMS,
    PARTITIONS,
    create_indexed_base,
    exact_order,
    named_rows,
    vector_column,
    vector_of,
)

UPDATED = range(100, 110)  # base keys generation 1 rewrites
DELETED = range(200, 205)  # base keys generation 2 deletes


@pytest.fixture
def table(local_location):
    """An IVF_PQ-indexed base of ids 0-299 and three unmerged generations of one region: 1 rewrites 100-109,
    2 deletes 200-204, 3 adds 1000-1019. Returns the location, region and the newest-wins model."""
    loc = local_location
    model = {i: f"b{i}" for i in range(300)}
    create_indexed_base(loc, model)
    region = str(uuid.uuid4())
    rewrites = {i: f"g1-{i}" for i in UPDATED}
    added = {i: f"g3-{i}" for i in range(1000, 1020)}
    flush_generation(loc, region, named_rows(rewrites))
    flush_generation(loc, region, None, DELETED)
    flush_generation(loc, region, named_rows(added))
    model.update(rewrites)
    model.update(added)
    for i in DELETED:
        del model[i]
    return loc, region, model


def _bloom_files(loc, region: str) -> list[str]:
    manifest = MemWalTable(loc.uri).manifest(region)
    return [os.path.join(loc.uri, bloom_filter_path(region, fg.path)) for fg in manifest.flushed_generations]


def _search_stale(reader: LsmReader, model: dict) -> list[dict]:
    """Exact searches at the vectors the stale base rows (rewritten or deleted keys) still hold: each stale
    row is its own query's nearest base candidate, so every one reaches the check."""
    found = []
    for i in [*UPDATED, *DELETED]:
        got = reader.search(vector_of(f"b{i}"), k=5, nprobes=PARTITIONS, refine_factor=math.ceil(len(model) / 5) + 1)
        for row in got.to_pylist():
            assert model.get(row["id"]) == row["name"], f"query b{i}: row {row['id']} {row['name']!r} is stale"
        found.append(reader.last_vector_plan)
    return found


def test_base_candidates_are_checked_by_bloom_filters_then_keys(table):
    loc, _, model = table
    plans = _search_stale(LsmReader(loc.uri), model)
    assert sum(p.shadowed for p in plans) >= len(UPDATED) + len(DELETED), "the stale base rows were not candidates"
    assert sum(p.bloom_skips for p in plans) > 0, "no generation was ruled out by its bloom filter"
    # A lookup only where a bloom filter said "maybe": at least every shadowed candidate, fewer than the
    # (candidate, generation) pairs the filters ruled out plus the lookups.
    probes = sum(p.key_probes for p in plans)
    assert sum(p.shadowed for p in plans) <= probes < sum(p.bloom_skips + p.key_probes for p in plans)


def test_the_bloom_filters_of_a_view_are_probed_at_once(table, monkeypatch):
    """A search's base candidates are probed in every generation's bloom filter in one step (one array of the
    view's filters, built once per snapshot), not filter by filter; the filters still rule candidates out."""
    loc, _, model = table
    one_by_one = []
    real = BloomFilter.might_contain_hashes
    monkeypatch.setattr(BloomFilter, "might_contain_hashes", lambda self, h: one_by_one.append(1) or real(self, h))
    plans = _search_stale(LsmReader(loc.uri), model)
    assert sum(p.bloom_skips for p in plans) > 0, "no generation was ruled out by its bloom filter"
    assert one_by_one == [], f"{len(one_by_one)} probes of one filter in {len(plans)} searches"


def test_a_generation_without_a_bloom_filter_is_checked_by_its_keys(table):
    loc, region, model = table
    for path in _bloom_files(loc, region):
        os.remove(path)
    plans = _search_stale(LsmReader(loc.uri), model)
    assert sum(p.bloom_skips for p in plans) == 0
    assert sum(p.key_probes for p in plans) >= sum(p.shadowed for p in plans) >= len(UPDATED) + len(DELETED)


def test_a_corrupt_bloom_filter_is_logged_and_its_keys_checked(table, caplog):
    loc, region, model = table
    broken = _bloom_files(loc, region)[0]
    with open(broken, "r+b") as f:
        f.truncate(100)  # not a whole number of 32-byte blocks
    with caplog.at_level(logging.WARNING, logger="memwal.newest_version"):
        _search_stale(LsmReader(loc.uri), model)
    assert any(region in r.getMessage() and "bloom_filter.bin" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]


def test_a_bloom_filters_no_is_taken_as_certain(table):
    """The check reads the bloom filters: one rewritten to hold no key makes its generation's versions
    invisible to base candidates (as the spec has readers trust a filter's "no")."""
    loc, region, _ = table
    rewrites = _bloom_files(loc, region)[0]  # generation 1: rewrites 100-109
    with open(rewrites, "wb") as f:
        f.write(BloomFilter(np.zeros((NUM_BLOCKS, 8), np.uint32)).to_bytes())
    reader = LsmReader(loc.uri)
    got = reader.search(vector_of("b100"), k=1, nprobes=PARTITIONS, refine_factor=400)
    assert got.column("name").to_pylist() == ["b100"], "the bloom filter was not consulted"


def test_shadowed_in_bulk_joins_composite_keys():
    keys = pa.table({"a": [1, 1, 2, 3], "b": ["x", "y", "x", None]})
    upper = pa.table({"a": [1, 2, 9], "b": ["y", "x", "x"]})
    assert shadowed_in_bulk(["a", "b"], keys, upper).tolist() == [False, True, True, False]
    assert shadowed_in_bulk(["a", "b"], keys, upper.slice(0, 0)).tolist() == [False] * 4



PK_TRUE_KEY = "lance-schema:unenforced-primary-key"
PK_TRUE = {PK_TRUE_KEY: "true"}
# Every key type the spec allows, and a composite key: (key fields, the key columns of row i).
KEY_TYPES = {
    "int32": ([pa.field("id", pa.int32(), nullable=False, metadata=PK_TRUE)], lambda i: {"id": i}),
    "int64": ([pa.field("id", pa.int64(), nullable=False, metadata=PK_TRUE)], lambda i: {"id": i}),
    "string": ([pa.field("id", pa.string(), nullable=False, metadata=PK_TRUE)], lambda i: {"id": f"k{i}"}),
    "large_string": ([pa.field("id", pa.large_string(), nullable=False, metadata=PK_TRUE)],
                     lambda i: {"id": f"k{i}"}),
    "binary": ([pa.field("id", pa.binary(), nullable=False, metadata=PK_TRUE)], lambda i: {"id": f"k{i}".encode()}),
    "composite": ([pa.field("a", pa.int64(), nullable=False, metadata={f"{PK_TRUE_KEY}:position": "1"}),
                   pa.field("b", pa.string(), nullable=False, metadata={f"{PK_TRUE_KEY}:position": "2"})],
                  lambda i: {"a": i, "b": f"k{i}"}),
}


def _keyed_rows(schema: pa.Schema, key, names: dict[int, str]) -> pa.Table:
    ids = sorted(names)
    keys = [key(i) for i in ids]
    return pa.table({**{c: [k[c] for k in keys] for c in keys[0]}, "name": [names[i] for i in ids],
                     "vec": vector_column([names[i] for i in ids])}, schema=schema)


@pytest.mark.parametrize("key_type", list(KEY_TYPES))
def test_a_generation_lance_core_flushed_is_newest_wins_for_every_key_type(tmp_path, key_type):
    """Base of 40 rows keyed by `key_type` (IVF_PQ-indexed vectors); Lance core's own region writer
    (`mem_wal_writer`) rewrites key 7 to another vector and adds key 100. A search at key 7's old vector never
    returns the stale base row, whatever Lance core's bloom filter holds for that key type."""
    fields, key = KEY_TYPES[key_type]
    schema = pa.schema([*fields, pa.field("name", pa.string()), pa.field("vec", pa.list_(pa.float32(), DIM))])
    uri = str(tmp_path / "t")
    names = {i: f"b{i}" for i in range(40)}
    ds = lance.write_dataset(_keyed_rows(schema, key, names), uri)
    ds.create_index("vec", "IVF_PQ", name="vec_idx", **IVF_PQ_PARAMS)
    lance.dataset(uri).initialize_mem_wal(maintained_indexes=["vec_idx"], unsharded=True)
    with lance.dataset(uri).mem_wal_writer(str(uuid.uuid4()), max_memtable_rows=2) as w:
        w.put(_keyed_rows(schema, key, {7: "new7", 100: "new100"}))
    assert list(Path(uri, MEM_WAL_DIR).glob(f"*/*_gen_*/{BLOOM_FILTER_FILE}")), "Lance core flushed no generation"
    model = {**names, 7: "new7", 100: "new100"}
    q = vector_of("b7")
    got = LsmReader(uri).search(q, k=5, nprobes=PARTITIONS, refine_factor=20, columns=["name"])
    stale = [(n, d) for n, d in zip(got.column("name").to_pylist(), got.column("_distance").to_pylist(),
                                    strict=True) if n not in model.values()]
    assert not stale, f"{key_type} keys: stale rows {stale} (at distance 0.0: key 7's old version)"
    assert got.column("_distance").to_pylist() == [d for d, _ in exact_order(model, q)[:5]], f"{key_type} keys"
    scanned = LsmReader(uri).scan(columns=["name"]).column("name").to_pylist()
    assert sorted(scanned) == sorted(model.values()), f"{key_type} keys: scan is not newest-wins"


def test_a_filter_over_an_untrusted_key_type_is_never_read(tmp_path):
    """large_string keys (Lance core's filter for them says nothing; ours hashed them as Utf8 before): our
    writer's generation rewrites key 7, its bloom filter rewritten to hold no key. The search still finds the
    base row stale: the filter was not asked."""
    fields, key = KEY_TYPES["large_string"]
    schema = pa.schema([*fields, pa.field("name", pa.string()), pa.field("vec", pa.list_(pa.float32(), DIM))])
    uri = str(tmp_path / "t")
    names = {i: f"b{i}" for i in range(40)}
    lance.write_dataset(_keyed_rows(schema, key, names), uri).create_index("vec", "IVF_PQ", name="vec_idx",
                                                                           **IVF_PQ_PARAMS)
    lance.dataset(uri).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    with RegionWriter(uri, region) as w:
        w.put(_keyed_rows(schema, key, {7: "new7"}))
    (bloom,) = Path(uri, MEM_WAL_DIR).glob(f"*/*_gen_*/{BLOOM_FILTER_FILE}")
    bloom.write_bytes(BloomFilter(np.zeros((NUM_BLOCKS, 8), np.uint32)).to_bytes())
    reader = LsmReader(uri)
    got = reader.search(vector_of("b7"), k=1, nprobes=PARTITIONS, refine_factor=40, columns=["name"])
    assert got.column("name").to_pylist() != ["b7"], "a large_string generation's bloom filter was believed"
    assert reader.last_vector_plan.bloom_skips == 0
