"""LsmReader.search on real-shaped data: null vectors (a null FixedSizeList entry: never a result, and never
shifting another row's vector or address) in every kind of source and under every metric, and an IVF index
with many partitions (nprobes far below them) under a narrow filter or a mass delete (never short)."""

from __future__ import annotations

import shutil
import uuid
from contextlib import ExitStack

import lance
import numpy as np
import pyarrow as pa
import pytest

from memwal import vector_search as vs
from memwal.reader import LsmReader
from memwal.storage import lance_storage_options

from support.locations import Location
from support.maintenance import flush_generation
from support.memtable_views import reader_with_memtable
from support.tables import PK
from support.vector_model import DIM, METRICS, QUERIES, assert_top_k, vector_of

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False, metadata=PK),
    pa.field("vec", pa.list_(pa.float32(), DIM)),
])
NULL = "null"  # the model's name of a row whose vector is null


def vector(name: str) -> np.ndarray | None:
    """The model's vector of a name: none for NULL, the zero vector for 'zero' (undefined under cosine)."""
    if name == NULL:
        return None
    return np.zeros(DIM, "float32") if name == "zero" else vector_of(name)


def rows_of(names: dict[int, str]) -> pa.Table:
    ids = sorted(names)
    vecs = [vector(names[i]) for i in ids]
    return pa.table({"id": pa.array(ids, pa.int64()),
                     "vec": pa.array([None if v is None else v.tolist() for v in vecs], SCHEMA.field("vec").type)},
                    schema=SCHEMA)


def base_table(loc, names: dict[int, str], metric: str = "l2") -> None:
    """A base table of `names` with an IVF_FLAT index of `metric` (2 partitions), MemWAL initialised."""
    opts = lance_storage_options(loc.storage_options)
    ds = lance.write_dataset(rows_of(names), loc.uri, storage_options=opts)
    ds.create_index("vec", "IVF_FLAT", name="vec_idx", num_partitions=2, metric=metric)
    lance.dataset(loc.uri, storage_options=opts).initialize_mem_wal(unsharded=True)


def pairs(t: pa.Table) -> list[tuple[float, int]]:
    return list(zip(t.column("_distance").to_pylist(), t.column("id").to_pylist(), strict=True))


def assert_own_vectors(t: pa.Table, model: dict[int, str], what: str) -> None:
    """Every row came back with its own vector, never a null one."""
    for r in t.to_pylist():
        assert r["vec"] is not None, f"{what}: row {r['id']} has a null vector and was returned"
        assert np.array_equal(r["vec"], vector(model[r["id"]])), f"{what}: row {r['id']} has another row's vector"


BASE = {i: f"b{i}" for i in range(20)}
ISSUE_ROWS = {100001: NULL, 100002: "v2", 100003: "v3"}  # the issue's MemTable


@pytest.mark.parametrize("where", ["memtable", "generation"])
@pytest.mark.parametrize("filter", [None, "id > 100000"])
def test_a_null_vector_shifts_no_row_after_it(local_location, where, filter):
    """The issue's case: ids 100001 (null vector), 100002, 100003 above the base; the nearest row to 100003's
    vector is 100003 at distance 0, and a search for every row returns each non-null row once at its own
    vector, never the null one: in a MemTable and after it is flushed to a generation."""
    loc, model = local_location, dict(BASE)
    base_table(loc, model)
    region = str(uuid.uuid4())
    with ExitStack() as stack:
        if where == "generation":
            flush_generation(loc, region, rows_of(ISSUE_ROWS))
            model.update(ISSUE_ROWS)
            reader = LsmReader(loc.uri)
        else:
            reader = stack.enter_context(reader_with_memtable(loc, region, ISSUE_ROWS, [], model, rows_of))
        top = reader.search(vector("v3"), k=1, filter=filter)
        assert pairs(top) == [(0.0, 100003)], f"{where}: nearest to 100003's vector: {pairs(top)}"
        every = reader.search(vector("v3"), k=100, filter=filter, nprobes=2, refine_factor=100)
        assert_own_vectors(every, model, where)
        kept = {i: n for i, n in model.items() if filter is None or i > 100000}
        assert_top_k(pairs(every), kept, vector("v3"), 100, where, vector=vector)


def test_a_null_vector_in_an_earlier_source_shifts_no_row_of_a_later_one(local_location):
    """Null vectors in the base, a generation and the MemTable, searched together (the small sources as one
    flat block): every row keeps its own vector and address, whichever source the null rows sit in."""
    loc, model = local_location, {**BASE, 5: NULL, 6: NULL}
    base_table(loc, model)
    region = str(uuid.uuid4())
    gen = {200001: NULL, 200002: "g2", 200003: "g3", 7: NULL}
    flush_generation(loc, region, rows_of(gen))
    model.update(gen)
    with reader_with_memtable(loc, region, {300001: "m1", 300002: NULL, 300003: "m3"}, [], model, rows_of) as r:
        for name, want in (("m3", 300003), ("g3", 200003), ("m1", 300001), ("b9", 9)):
            top = r.search(vector(name), k=1)
            assert pairs(top) == [(0.0, want)], f"nearest to {want}'s vector: {pairs(top)}"
        every = r.search(QUERIES[1], k=100, nprobes=2, refine_factor=100)
        assert_own_vectors(every, model, "every source")
        assert_top_k(pairs(every), model, QUERIES[1], 100, "every source", vector=vector)


@pytest.mark.parametrize("metric", METRICS)
def test_every_metric_with_null_and_zero_vectors_equals_brute_force(local_location, metric):
    """Under l2, cosine and dot (the base index's metric), over the base (indexed), a generation (flat) and the
    MemTable, with and without a filter: the result equals the brute-force newest-wins search, null vectors
    (and, under cosine, zero vectors: Lance returns none) are never results."""
    loc, model = local_location, {**BASE, 3: NULL, 4: "zero"}
    base_table(loc, model, metric)
    region = str(uuid.uuid4())
    gen = {1: NULL, 2: "zero", 400001: "g1", 400002: NULL}
    flush_generation(loc, region, rows_of(gen))
    model.update(gen)
    with reader_with_memtable(loc, region, {500001: NULL, 500002: "m2", 10: "zero"}, [], model, rows_of) as r:
        for qi, q in enumerate((*QUERIES[1:], vector("m2"))):
            for filter, keep in ((None, lambda i: True), ("id < 400000", lambda i: i < 400000)):
                kept = {i: n for i, n in model.items() if keep(i)}
                got = r.search(q, k=100, filter=filter, nprobes=2, refine_factor=100)
                assert_own_vectors(got, model, f"{metric}, query {qi}, filter {filter}")
                assert_top_k(pairs(got), kept, q, 100, f"{metric}, query {qi}, filter {filter}", metric, vector)


# An IVF index with many partitions, nprobes far below them: 20,000 rows in 4 dimensions, IVF_FLAT with 256
# partitions (the default nprobes probes 80), 1,000 tenants of 20 rows each spread over every partition.
MANY_ROWS, MANY_DIM, MANY_PARTITIONS, TENANTS = 20_000, 4, 256, 1_000
MANY_SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False, metadata=PK),
    pa.field("tenant", pa.int64()),
    pa.field("vec", pa.list_(pa.float32(), MANY_DIM)),
])
MANY_QUERIES = np.random.default_rng(1).standard_normal((5, MANY_DIM)).astype("float32")


@pytest.fixture(scope="module")
def many_partitions(tmp_path_factory) -> tuple[str, np.ndarray]:
    """The base table (built once per module; a test that writes above it copies it) and its vectors. Tenant 7's
    20 rows lie apart, ten standard deviations out: whatever partitions Lance's k-means draws, the ones nearest
    a query (the default nprobes) hold none of them, so Lance at that nprobes is short for every query."""
    uri = str(tmp_path_factory.mktemp("many") / "table")
    vecs = np.random.default_rng(0).standard_normal((MANY_ROWS, MANY_DIM)).astype("float32")
    ids = np.arange(MANY_ROWS)
    tenant = ids % TENANTS == 7
    vecs[tenant] = 10.0 + np.random.default_rng(2).standard_normal((int(tenant.sum()), MANY_DIM)).astype("float32")
    t = pa.table({"id": pa.array(ids, pa.int64()), "tenant": pa.array(ids % TENANTS, pa.int64()),
                  "vec": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), MANY_DIM)}, schema=MANY_SCHEMA)
    ds = lance.write_dataset(t, uri)
    ds.create_index("vec", "IVF_FLAT", name="vec_idx", num_partitions=MANY_PARTITIONS)
    lance.dataset(uri).initialize_mem_wal(unsharded=True)
    return uri, vecs


def _l2(vecs: np.ndarray, q: np.ndarray) -> np.ndarray:
    return ((vecs - q) ** 2).sum(axis=1)


def assert_at_own_distances(got: pa.Table, vecs: np.ndarray, q: np.ndarray, what: str) -> None:
    ids = np.asarray(got.column("id").to_pylist(), int)
    assert np.allclose(got.column("_distance").to_numpy(), _l2(vecs[ids], q), rtol=1e-5), f"{what}: distances"


def test_a_narrow_filter_on_an_index_with_many_partitions_is_never_short(many_partitions):
    """The issue's case, smaller: a filter matching 20 rows of 20,000 in an index of 256 partitions, none of them
    in the partitions the default nprobes (80) probes; Lance at that nprobes finds fewer than k of them (checked
    through Lance itself), yet the search returns k rows of that tenant for every query."""
    uri, vecs = many_partitions
    nprobes = vs.default_nprobes(MANY_PARTITIONS)
    assert nprobes < MANY_PARTITIONS / 3, "the case needs nprobes far below the partitions"
    ds, reader = lance.dataset(uri), LsmReader(uri)
    lance_short = 0
    for qi, q in enumerate(MANY_QUERIES):
        fixed = {"column": "vec", "q": q, "k": 10, "nprobes": nprobes}
        lance_short += ds.to_table(columns=["id"], nearest=fixed, filter="tenant = 7", prefilter=True).num_rows < 10
        got = reader.search(q, k=10, filter="tenant = 7", columns=["id", "tenant"])
        assert got.num_rows == 10, f"query {qi}: short result ({got.num_rows} rows)"
        assert set(got.column("tenant").to_pylist()) == {7}, f"query {qi}: a row outside the filter"
        assert_at_own_distances(got, vecs, q, f"query {qi}")
    assert lance_short, "the scenario must be one where nprobes partitions hold fewer than k matching rows"


def test_a_mass_delete_near_the_query_is_never_short(many_partitions, tmp_path):
    """Without a filter: every row of the partitions the default nprobes probes for q (what Lance returns at
    that nprobes and k = all rows) is deleted in a generation, so every candidate there is shadowed; the
    search still returns k live rows."""
    base, vecs = many_partitions
    uri = str(tmp_path / "table")
    shutil.copytree(base, uri)
    q = MANY_QUERIES[0]
    probed = {"column": "vec", "q": q, "k": MANY_ROWS, "nprobes": vs.default_nprobes(MANY_PARTITIONS)}
    deleted = lance.dataset(uri).to_table(columns=["id"], nearest=probed).column("id").to_pylist()
    assert 10 <= len(deleted) <= MANY_ROWS / 2, "the probed partitions must hold some rows, far from all"
    flush_generation(Location("local", uri, None), str(uuid.uuid4()), None, deleted)
    reader = LsmReader(uri)
    got = reader.search(q, k=10, columns=["id"])
    assert got.num_rows == 10, f"short result ({got.num_rows} rows): {reader.last_vector_plan.to_dict()}"
    assert not set(got.column("id").to_pylist()) & set(deleted), "a deleted row came back"
    assert_at_own_distances(got, vecs, q, "mass delete")
