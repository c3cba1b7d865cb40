"""memwal.source_cache: what a search reads of an immutable source (a flushed generation's keys, bloom filter,
index descriptions and statistics, vectors and their projected heads) is read once per process, so the first
search of a new snapshot reads only the generation flushed since (issue 44: a table taking streaming writes
gets a new snapshot at every flush). The answers stay exact and newest-wins while newer generations shadow
rows of the cached ones."""

from __future__ import annotations

import shutil
import uuid

import lance
import numpy as np
import pyarrow as pa
import pytest
from test_vector_search import _assert_newest, _exact, _pairs, create_base, flush

import memwal.block_pruning as bp
import memwal.flat_block as fb
import memwal.newest_version as nv
from memwal import source_cache
from memwal.reader import LsmReader

from support.vector_model import QUERIES, assert_top_k, vector_of


@pytest.fixture(autouse=True)
def _empty_cache():
    source_cache.clear()
    yield
    source_cache.clear()


def _named(ids, tag: str) -> dict[int, str]:
    return {i: f"{tag}-{i}" for i in ids}


def _apply(model: dict, puts: dict, deletes=()) -> None:
    model.update(puts)
    for i in deletes:
        model.pop(i, None)


class _Reads:
    """Which datasets a search read rows of (to_table / count_rows, by URI) and which bloom filters it read."""

    def __init__(self, monkeypatch):
        self.datasets: list[str] = []
        self.blooms: list[str] = []
        real_table, real_count, real_bloom = (lance.LanceDataset.to_table, lance.LanceDataset.count_rows,
                                              nv.read_bloom_filter)

        def to_table(ds, *args, **kwargs):
            self.datasets.append(ds.uri)
            return real_table(ds, *args, **kwargs)

        def count_rows(ds, *args, **kwargs):
            self.datasets.append(ds.uri)
            return real_count(ds, *args, **kwargs)

        def bloom(store, region_id, path):
            self.blooms.append(path)
            return real_bloom(store, region_id, path)

        monkeypatch.setattr(lance.LanceDataset, "to_table", to_table)
        monkeypatch.setattr(lance.LanceDataset, "count_rows", count_rows)
        monkeypatch.setattr(nv, "read_bloom_filter", bloom)


def _lower_pruning_limits(monkeypatch) -> list[int]:
    """block_pruning on the tests' 8-dimensional blocks of ~100 rows (a head of 2); returns a list that grows
    by the rows of every head_of call (rows projected)."""
    for name, value in (("MIN_DIM", 4), ("MIN_ROWS", 16), ("_SEEDS", 2), ("_GIVE_UP", 1.0),
                        ("head_dims", lambda dim: 2)):
        monkeypatch.setattr(bp, name, value)
    monkeypatch.setattr(fb, "MIN_ROWS", 16)
    projected: list[int] = []
    real = fb.head_of
    monkeypatch.setattr(fb, "head_of", lambda vecs, axes: projected.append(len(vecs)) or real(vecs, axes))
    return projected


def test_a_new_snapshot_reads_only_the_generation_flushed_since(local_location, monkeypatch):
    loc = local_location
    model = _named(range(300), "b")
    create_base(loc, model)
    region = str(uuid.uuid4())
    for puts, deletes in ((_named([*range(300, 340), *range(0, 20)], "g1"), ()),
                          (_named(range(1000, 1020), "g2"), range(60, 70))):
        flush(loc, region, puts, deletes)
        _apply(model, puts, deletes)
    first = LsmReader(loc.uri)
    for q in QUERIES:
        _exact(first, model, q, 10)
    older = {s.dataset.uri for s in first.sources if s.path is not None}
    assert len(older) == 2

    puts, deletes = _named([*range(0, 10), *range(2000, 2005)], "g3"), [300, 1000]
    flush(loc, region, puts, deletes)
    _apply(model, puts, deletes)
    reads = _Reads(monkeypatch)
    reader = LsmReader(loc.uri)
    new = [s for s in reader.sources if s.path is not None and s.dataset.uri not in older]
    assert len(new) == 1
    for qi, q in enumerate(QUERIES):
        got = _exact(reader, model, q, 10)
        _assert_newest(got, model, f"after a flush, query {qi}")
        assert_top_k(_pairs(got), model, q, 10, f"after a flush, query {qi}")
    assert not older & set(reads.datasets), "a generation read before was read again for the new snapshot"
    assert new[0].dataset.uri in reads.datasets
    assert reads.blooms == [new[0].path], "only the new generation's bloom filter is read"


def test_cached_generations_stay_exact_as_newer_ones_shadow_their_rows(local_location, monkeypatch):
    """Snapshot after snapshot, each generation's vectors and projected heads are made once; rows a newer
    generation updates or deletes never come back; the searches equal brute force newest-wins, through the
    pruned block. The axes are kept while most of the block is projected on them, and made again once the
    block is mostly new rows."""
    projected = _lower_pruning_limits(monkeypatch)
    loc = local_location
    model = _named(range(300), "b")
    create_base(loc, model)
    region = str(uuid.uuid4())
    steps = [
        (_named(range(300, 380), "g1"), ()),
        (_named([*range(300, 310), *range(500, 510)], "g2"), [320, 321]),  # updates and deletes g1 rows
        (_named([*range(330, 335), 511], "g3"), [505]),
        (_named(range(600, 900), "g4"), [300]),  # more rows than the rest of the block: new axes
    ]
    tokens, made = [], []
    for step, (puts, deletes) in enumerate(steps):
        flush(loc, region, puts, deletes)
        _apply(model, puts, deletes)
        before = len(projected)
        reader = LsmReader(loc.uri)
        for qi, q in enumerate(QUERIES):
            for k in (1, 10):
                got = _exact(reader, model, q, k)
                _assert_newest(got, model, f"step {step}, query {qi}, k={k}")
                assert_top_k(_pairs(got), model, q, k, f"step {step}, query {qi}, k={k}")
            for old in (f"g1-{i}" for i in (300, 320, 330)):  # their old vectors find only the newest versions
                _assert_newest(reader.search(vector_of(old), k=20), model, f"step {step}, old {old}")
        block = next(v for k, v in reader.search_cache.items() if isinstance(k, tuple) and k[0] == "flat block")
        assert block.pruning is not None, f"step {step}: the block was not projected"
        tokens.append(block.pruning.axes)
        made.append(projected[before:])
    assert made[0] == [80], "the first snapshot projects its one generation"
    assert made[1] == [20] and made[2] == [6], "later snapshots project only the generation flushed since"
    assert tokens[1] is tokens[0] and tokens[2] is tokens[0], "the axes were kept"
    assert tokens[3] is not tokens[0] and sorted(made[3]) == [6, 20, 80, 300], \
        "a block of mostly new rows gets new axes, every generation projected on them"


def test_a_process_keeps_the_axes_of_its_most_recently_searched_tables(local_location, monkeypatch):
    """_AXES holds at most _AXES_KEPT tables' axes, least recently used out: a service searching many tables does
    not keep one set per table forever (a forgotten table's are made again; any axes keep the search exact)."""
    _lower_pruning_limits(monkeypatch)
    others = [(f"s3://elsewhere/t{i}", "vec", "l2", 8) for i in range(2)]
    monkeypatch.setattr(fb, "_AXES", fb.OrderedDict((k, bp.Axes("l2", np.zeros(8), np.eye(8)[:, :2])) for k in others))
    monkeypatch.setattr(fb, "_AXES_KEPT", 2)
    loc = local_location
    model = _named(range(300), "b")
    create_base(loc, model)
    puts = _named(range(300, 380), "g1")
    flush(loc, str(uuid.uuid4()), puts)
    _apply(model, puts)
    reader = LsmReader(loc.uri)
    for qi, q in enumerate(QUERIES):
        assert_top_k(_pairs(_exact(reader, model, q, 10)), model, q, 10, f"query {qi}")
    kept = list(fb._AXES)
    assert len(kept) == 2 and kept[0] == others[1], "the least recently used table's axes went"
    assert kept[1][0] == reader.store.uri


def _dataset(path, ids) -> lance.LanceDataset:
    return lance.write_dataset(pa.table({"id": pa.array(ids, pa.int64())}), str(path), mode="overwrite")


def test_a_value_is_made_once_per_dataset_content(tmp_path):
    ds = _dataset(tmp_path / "a", range(10))
    made = []
    assert source_cache.cached(ds, "n", lambda: made.append(1) or ds.count_rows()) == 10
    assert source_cache.cached(lance.dataset(str(tmp_path / "a")), "n", lambda: made.append(1) or -1) == 10
    assert made == [1], "the same version's content is read once"
    newer = _dataset(tmp_path / "a", range(5))  # a new version at the same URI
    assert source_cache.cached(newer, "n", newer.count_rows) == 5
    shutil.rmtree(tmp_path / "a")
    recreated = _dataset(tmp_path / "a", range(3))  # removed and recreated: version 1 again, other rows
    assert recreated.version == ds.version
    assert source_cache.cached(recreated, "n", recreated.count_rows) == 3
    memory = lance.write_dataset(pa.table({"id": [1, 2]}), f"memory://t-{uuid.uuid4().hex}")
    assert source_cache.identity(memory) is None
    assert source_cache.cached(memory, "n", lambda: made.append(2) or 2) == 2
    assert source_cache.cached(memory, "n", lambda: made.append(2) or 2) == 2
    assert made == [1, 2, 2], "an in-memory dataset (a MemTable) is not kept"


def test_what_a_cached_value_holds_is_counted():
    """The byte bound counts a generation's bloom filter by its words, a piece by its arrays."""
    from memwal.bloom_filter import BloomFilter

    bloom = BloomFilter.from_keys(pa.array([1, 2, 3], pa.int64()))
    assert source_cache.nbytes(bloom) >= len(bloom.to_bytes())
    piece = fb._Piece(np.zeros(10, np.uint64), np.zeros((10, 8), np.float32), np.zeros(10))
    assert source_cache.nbytes(piece) >= 80 + 320 + 80


def test_the_cache_keeps_at_most_its_bytes_least_recently_used_out(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMWAL_SOURCE_CACHE_BYTES", str(3 * 8_000 + 200))
    datasets = [_dataset(tmp_path / f"d{i}", range(3)) for i in range(4)]
    made = []

    def value(i):
        return lambda: made.append(i) or np.zeros(1_000)  # 8,000 bytes

    for i in (0, 1, 2):
        source_cache.cached(datasets[i], "v", value(i))
    source_cache.cached(datasets[0], "v", value(0))  # 0 used again: 1 is now the least recently used
    source_cache.cached(datasets[3], "v", value(3))
    assert source_cache.peek(datasets[1], "v") is None
    assert all(source_cache.peek(datasets[i], "v") is not None for i in (0, 2, 3))
    assert made == [0, 1, 2, 3]
    monkeypatch.setenv("MEMWAL_SOURCE_CACHE_BYTES", "0")
    source_cache.cached(datasets[0], "w", value(9))
    source_cache.cached(datasets[0], "w", value(9))
    assert made[-2:] == [9, 9] and source_cache.peek(datasets[0], "w") is None, "0 bytes: nothing kept"
