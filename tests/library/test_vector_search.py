"""LsmReader.search: the k nearest live newest rows over the LSM view (base, merged-but-not-caught-up
generations, unmerged generations, MemTables), filter as a prefilter, never short, exact with every partition
probed and enough refinement, compared with a brute-force newest-wins model (tests/vector_model.py)."""

from __future__ import annotations

import math
import uuid

import lance
import numpy as np
import pyarrow as pa
import pytest

from memwal import vector_search as vs
from memwal.errors import BadInputError
from memwal.merge import merge_table
from memwal.reader import LsmReader
from memwal.storage import lance_storage_options

from support.maintenance import flush_generation
from support.memtable_views import reader_with_memtable
from support.tables import PK
from support.vector_model import DIM, IVF_PQ_PARAMS, PARTITIONS, QUERIES, assert_top_k, vector_column, vector_of

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False, metadata=PK),
    pa.field("name", pa.string()),
    pa.field("grp", pa.int64()),
    pa.field("vec", pa.list_(pa.float32(), DIM)),
])


def table_of(names: dict[int, str]) -> pa.Table:
    ids = sorted(names)
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [names[i] for i in ids],
                     "grp": pa.array([i % 3 for i in ids], pa.int64()),
                     "vec": vector_column([names[i] for i in ids])}, schema=SCHEMA)


def flush(loc, region: str, puts: dict[int, str], deletes=()) -> None:
    flush_generation(loc, region, table_of(puts) if puts else None, deletes)


def create_base(loc, model: dict[int, str], maintained: bool = False) -> dict:
    """The base table of `model` with an IVF_PQ index `vec_idx` (maintained if asked), MemWAL initialised;
    returns the Lance storage options."""
    opts = lance_storage_options(loc.storage_options)
    ds = lance.write_dataset(table_of(model), loc.uri, storage_options=opts)
    ds.create_index("vec", "IVF_PQ", name="vec_idx", **IVF_PQ_PARAMS)
    lance.dataset(loc.uri, storage_options=opts).initialize_mem_wal(
        maintained_indexes=["vec_idx"] if maintained else None, unsharded=True)
    return opts


@pytest.fixture
def lsm(local_location):
    """The LSM view and its model (id -> name; a row's vector is vector_of(name)):

    | level                                     | rows                                             |
    | base (IVF_PQ index)                       | ids 0-299 'b{i}'                                 |
    | generation 1, merged, index not caught up | ids 300-339 new, 100-119 updated                 |
    | generation 2, unmerged                    | ids 0-59 updated, 60-69 deleted, 1000-1019 new   |
    | MemTable                                  | ids 1000-1004 updated, 2000-2004 new, 70 deleted |
    """
    loc = local_location
    model = {i: f"b{i}" for i in range(300)}
    create_base(loc, model)
    region = str(uuid.uuid4())
    gen1 = {i: f"g1-{i}" for i in [*range(300, 340), *range(100, 120)]}
    flush(loc, region, gen1)
    merge_table(loc.uri)
    model.update(gen1)
    gen2 = {i: f"g2-{i}" for i in [*range(0, 60), *range(1000, 1020)]}
    flush(loc, region, gen2, deletes=range(60, 70))
    model.update(gen2)
    for i in range(60, 70):
        del model[i]
    mem = {i: f"m-{i}" for i in [*range(1000, 1005), *range(2000, 2005)]}
    with reader_with_memtable(loc, region, mem, [70], model, table_of) as reader:
        yield reader, model


def _pairs(t: pa.Table) -> list[tuple[float, int]]:
    return list(zip(t.column("_distance").to_pylist(), t.column("id").to_pylist(), strict=True))


def _exact(reader: LsmReader, model: dict, q, k: int, **kw) -> pa.Table:
    return reader.search(q, k=k, nprobes=PARTITIONS, refine_factor=math.ceil(len(model) / k) + 1, **kw)


def _assert_newest(t: pa.Table, model: dict, what: str) -> None:
    rows = t.to_pylist()
    assert len({r["id"] for r in rows}) == len(rows), f"{what}: a key came back twice"
    for r in rows:
        assert model.get(r["id"]) == r["name"], f"{what}: row {r['id']} {r['name']!r} is not its newest version"
        assert np.array_equal(r["vec"], vector_of(r["name"])), f"{what}: row {r['id']} has another row's vector"


@pytest.mark.parametrize("qi", range(len(QUERIES)))
@pytest.mark.parametrize("k", [1, 10, 500])
def test_exact_search_equals_brute_force_newest_wins(lsm, qi, k):
    reader, model = lsm
    got = _exact(reader, model, QUERIES[qi], k)
    _assert_newest(got, model, f"query {qi}, k={k}")
    assert_top_k(_pairs(got), model, QUERIES[qi], min(k, len(model)), f"query {qi}, k={k}")


@pytest.mark.parametrize("filter, allowed", [
    ("grp = 1", lambda i: i % 3 == 1),
    ("id >= 1000", lambda i: i >= 1000),
    ("grp = 2 AND id < 150", lambda i: i % 3 == 2 and i < 150),
])
def test_filter_is_a_prefilter_on_the_newest_versions(lsm, filter, allowed):
    reader, model = lsm
    kept = {i: n for i, n in model.items() if allowed(i)}
    for qi, q in enumerate(QUERIES):
        got = _exact(reader, model, q, 10, filter=filter)
        _assert_newest(got, model, f"filter {filter!r}")
        assert_top_k(_pairs(got), kept, q, min(10, len(kept)), f"filter {filter!r}, query {qi}")


def test_stale_and_deleted_versions_never_come_back(lsm):
    """Rows 0-59 were updated in generation 2, 60-69 deleted there, 70 in the MemTable: searching for their old
    vectors finds only newest versions, every live row once."""
    reader, model = lsm
    for i in (0, 59, 65, 70, 100):
        got = reader.search(vector_of(f"b{i}"), k=len(model) + 50)
        _assert_newest(got, model, f"old vector of {i}")
        assert sorted(got.column("id").to_pylist()) == sorted(model), "the live rows are not each returned once"


def test_a_source_whose_candidates_were_shadowed_is_asked_for_more(lsm):
    """With filter id < 60 every base row passing it is stale (updated in generation 2): the base's first
    candidates are all shadowed, so it is asked again until exhausted, and the result is never short."""
    reader, model = lsm
    got = reader.search(vector_of("b0"), k=5, filter="id < 60")
    assert got.num_rows == 5, "short result"
    _assert_newest(got, model, "filter id < 60")
    plan = reader.last_vector_plan
    assert plan.extra_rounds > 0 and plan.shadowed >= 60, plan.to_dict()


@pytest.mark.parametrize("k", [3, 10, 40])
def test_ann_at_defaults_returns_live_newest_rows_never_short(lsm, k):
    reader, model = lsm
    for q in QUERIES:
        got = reader.search(q, k=k, columns=["id", "name", "vec"])
        assert got.num_rows == k, "short result"
        _assert_newest(got, model, f"ANN k={k}")
        d = got.column("_distance").to_pylist()
        assert d == sorted(d), "not nearest first"


def test_plan_counts_indexed_and_flat_sources(lsm):
    """The base is asked through its IVF_PQ index over its indexed fragments only; the merged, not yet indexed
    generation 1 (the gap), our writer's small generation 2 (whatever index they carry) and the MemTable are
    read flat; all are counted."""
    reader, _ = lsm
    reader.search(QUERIES[0])
    plan = reader.last_vector_plan
    assert (plan.indexed_sources, plan.flat_sources) == (1, 3), plan.to_dict()
    assert plan.rows_served_flat >= 60 + 90 + 11, plan.to_dict()


def test_a_generation_with_its_own_index_is_still_searched_exactly(lsm, monkeypatch):
    """A generation carrying an IVF_PQ index of its own is asked through it when it is large; with enough
    refinement the result stays exact (replace=True: our flush may already have built one of another type)."""
    reader, model = lsm
    gen = next(s for s in reader.sources if s.generation == 2)
    gen.dataset.create_index("vec", "IVF_PQ", name="vec_idx", replace=True, **IVF_PQ_PARAMS)
    fresh = LsmReader(reader.table, memtables=[(s.region_id, s.generation, s.dataset.to_table())
                                                for s in reader.sources if s.dataset.uri.startswith("memory://")])
    monkeypatch.setattr(vs, "FLAT_ROWS", 0)
    for qi, q in enumerate(QUERIES):
        got = _exact(fresh, model, q, 10)
        _assert_newest(got, model, "indexed generation")
        assert_top_k(_pairs(got), model, q, 10, f"indexed generation, query {qi}")
    assert fresh.last_vector_plan.indexed_sources >= 2, fresh.last_vector_plan.to_dict()


@pytest.mark.parametrize("kwargs, message", [
    ({"k": 0}, "k must be a positive integer"),
    ({"nprobes": -1}, "nprobes must be a positive integer"),
    ({"refine_factor": 1.5}, "refine_factor must be a positive integer"),
    ({"column": "name"}, "column 'name' for search is not a fixed-size vector column"),
    ({"columns": ["nope"]}, "columns ['nope'] are not in the table"),
])
def test_bad_arguments_are_refused_naming_the_parameter(lsm, kwargs, message):
    reader, _ = lsm
    with pytest.raises(BadInputError, match=r"table .*" + __import__("re").escape(message)):
        reader.search(QUERIES[0], **kwargs)


def test_a_vector_of_the_wrong_length_is_refused(lsm):
    reader, _ = lsm
    with pytest.raises(BadInputError, match=f"search vector must be {DIM} finite numbers for column 'vec'"):
        reader.search([1.0, 2.0])


def test_the_first_ask_of_an_indexed_source_grows_with_what_may_shadow_it():
    """k plus what the rows above may shadow, at most the earlier fixed 2k: 14 for bench/search.py's 1M base
    under 60,000 newer rows, 2k when they are as many as half the base."""
    assert vs.first_ask(10, 1_000_000, 0) == 11
    assert vs.first_ask(10, 1_000_000, 60_000) == 14
    assert vs.first_ask(10, 100_000, 60_000) == 20
    assert all(10 < vs.first_ask(10, 10**6, n) <= 20 for n in (0, 10, 10**3, 10**5, 10**7))


def _lance_reads(monkeypatch) -> list[tuple[str, bool]]:
    """Every Lance read from now on: (dataset URI, whether it was a KNN)."""
    reads: list[tuple[str, bool]] = []
    real = lance.LanceDataset.to_table

    def to_table(self, *args, **kwargs):
        reads.append((self.uri, kwargs.get("nearest") is not None))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(lance.LanceDataset, "to_table", to_table)
    return reads


def test_a_filtered_search_reads_the_small_sources_as_one_block(lsm, monkeypatch):
    """With a filter too, the small generations and the MemTable are searched as one block (no Lance search of
    each), exactly; once a filter string has been searched, searching it again reads none of them."""
    reader, model = lsm
    kept = {i: n for i, n in model.items() if i % 3 == 1}
    _exact(reader, model, QUERIES[0], 10, filter="grp = 1")
    reads = _lance_reads(monkeypatch)
    for qi, q in enumerate(QUERIES):
        got = _exact(reader, model, q, 10, filter="grp = 1")
        _assert_newest(got, model, f"filter grp = 1, query {qi}")
        assert_top_k(_pairs(got), kept, q, 10, f"filter grp = 1, query {qi}")
    assert reads == [(reader.base.uri, True)] * len(QUERIES), "a small source was read or searched on its own"


def test_an_unfiltered_search_plans_once_per_snapshot(lsm, monkeypatch):
    """The sources, their indexes and first asks of an unfiltered search are worked out once per reader."""
    reader, _ = lsm
    planned = []
    real = vs.plan_sources
    monkeypatch.setattr(vs, "plan_sources", lambda *a, **kw: planned.append(a) or real(*a, **kw))
    for q in QUERIES:
        reader.search(q, k=5)
    assert len(planned) == 1, f"planned {len(planned)} times for {len(QUERIES)} searches"


def test_the_block_searched_beside_the_base_in_a_thread_is_as_exact(lsm, monkeypatch):
    """vector_search.CONCURRENT: the small sources' block searched in a thread while Lance searches the base
    gives the same exact newest-wins answer."""
    reader, model = lsm
    monkeypatch.setattr(vs, "CONCURRENT", True)
    for qi, q in enumerate(QUERIES):
        for k in (1, 10):
            got = _exact(reader, model, q, k)
            _assert_newest(got, model, f"concurrent, query {qi}, k={k}")
            assert_top_k(_pairs(got), model, q, k, f"concurrent, query {qi}, k={k}")


@pytest.mark.parametrize("cpus, load, spare", [(2, 0.4, True), (2, 3.9, True), (2, 4.0, False), (2, 8.5, False),
                                               (8, 15.5, True), (1, 0.0, False), (None, 0.0, False)])
def test_by_default_the_block_is_searched_in_a_thread_unless_the_machine_is_oversubscribed(lsm, monkeypatch, cpus,
                                                                                          load, spare):
    """CONCURRENT None (the default): a thread beside the base search while the last minute's load is below
    twice the core count (on 2 cores it gained 0.5-1 ms at load 1.6-3.4, and cost as much at load 6-9); the
    same answers either way."""
    reader, model = lsm
    assert vs.CONCURRENT is None
    monkeypatch.setattr(vs.os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(vs.os, "getloadavg", lambda: (load, load, load))
    threaded = []
    real = vs._pool
    monkeypatch.setattr(vs, "_pool", lambda: threaded.append(1) or real())
    got = _exact(reader, model, QUERIES[1], 10)
    assert_top_k(_pairs(got), model, QUERIES[1], 10, f"cpus {cpus}, load {load}")
    assert bool(threaded) is spare


def test_the_block_searched_through_its_projected_head_is_as_exact(lsm, monkeypatch):
    """memwal.block_pruning on this view's small block (its limits lowered to the test's 8 dimensions and ~100
    rows, a head of 2): the same exact newest-wins answer, filtered or not, and the head pass was used."""
    import memwal.block_pruning as bp
    import memwal.flat_block as fb

    reader, model = lsm
    for name, value in (("MIN_DIM", 4), ("MIN_ROWS", 16), ("_SEEDS", 2), ("_GIVE_UP", 1.0),
                        ("head_dims", lambda dim: 2)):
        monkeypatch.setattr(bp, name, value)
    monkeypatch.setattr(fb, "MIN_ROWS", 16)
    pruned = []
    real = fb.pruned_rows
    monkeypatch.setattr(fb, "pruned_rows", lambda *a, **kw: pruned.append(1) or real(*a, **kw))
    kept = {i: n for i, n in model.items() if i % 3 == 1}
    for qi, q in enumerate(QUERIES):
        for k in (1, 10):
            got = _exact(reader, model, q, k)
            _assert_newest(got, model, f"pruned, query {qi}, k={k}")
            assert_top_k(_pairs(got), model, q, k, f"pruned, query {qi}, k={k}")
            got = _exact(reader, model, q, k, filter="grp = 1")
            assert_top_k(_pairs(got), kept, q, k, f"pruned, filter grp = 1, query {qi}, k={k}")
    assert len(pruned) == 4 * len(QUERIES), "the block was not searched through its head"
