"""Our LSM vector search over generations flushed by Lance core (its ShardWriter, the maintained vector index
built per generation) and by LanceDB: their index types, their files; exact with every partition probed and
refined, live newest rows otherwise, never short."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from test_vector_search import create_base, table_of

from memwal import vector_search as vs
from memwal.reader import LsmReader

from support.lance_core_writes import write_through_lance_core
from support.vector_model import PARTITIONS, QUERIES, assert_top_k, vector_of


def _pairs(t: pa.Table) -> list[tuple[float, int]]:
    return list(zip(t.column("_distance").to_pylist(), t.column("id").to_pylist(), strict=True))


@pytest.fixture
def lance_core_lsm(local_location):
    """Lance core's ShardWriter flushes generations carrying the maintained vector index:

    | level                  | rows                                         |
    | base (IVF_PQ)          | ids 0-299 'b{i}'                             |
    | Lance core generations | ids 0-39 updated, 300-359 new, 5-9 deleted   |"""
    loc = local_location
    model = {i: f"b{i}" for i in range(300)}
    opts = create_base(loc, model, maintained=True)
    puts = [{i: f"g-{i}" for i in range(0, 40)}, {i: f"g-{i}" for i in range(300, 360)}]
    write_through_lance_core(loc.uri, opts, puts, range(5, 10), model, table_of)
    reader = LsmReader(loc.uri)
    generations = reader.sources[1:]
    assert len(generations) >= 2, "the scenario must span several Lance core generations"
    assert all(any(vs.is_vector_index(d, "vec") for d in g.dataset.describe_indices()) for g in generations), \
        "Lance core flushed a generation without the maintained vector index"
    return reader, model


@pytest.mark.parametrize("k", [5, 50])
def test_exact_search_over_lance_core_generations(lance_core_lsm, k):
    reader, model = lance_core_lsm
    for qi, q in enumerate(QUERIES):
        got = reader.search(q, k=k, nprobes=PARTITIONS, refine_factor=math.ceil(len(model) / k) + 1)
        assert_top_k(_pairs(got), model, q, k, f"query {qi}, k={k}")
        assert all(model[r["id"]] == r["name"] for r in got.to_pylist()), "a stale or deleted row came back"


def test_lance_core_generations_asked_through_their_own_index(lance_core_lsm, monkeypatch):
    """Through the generations' own index (Lance core builds IVF_HNSW_SQ there): every row returned is its key's
    newest version at its exact distance, never short."""
    reader, model = lance_core_lsm
    monkeypatch.setattr(vs, "FLAT_ROWS", 0)
    for q in (*QUERIES, vector_of("b0"), vector_of("b5")):  # b0 is stale, b5 deleted
        got = reader.search(q, k=20, columns=["id", "name"])
        rows = got.to_pylist()
        assert len(rows) == 20 and len({r["id"] for r in rows}) == 20, "short or repeated"
        for r in rows:
            assert model.get(r["id"]) == r["name"], f"row {r['id']} {r['name']} is not the newest version"
            want = float(((vector_of(r["name"]) - q) ** 2).sum())
            assert r["_distance"] == pytest.approx(want, rel=1e-6), "not re-ranked by its exact distance"
        plan = reader.last_vector_plan
        assert plan.indexed_sources == len(reader.sources) and plan.flat_sources == 0, plan.to_dict()


def test_generations_lancedb_flushed_are_searched_exactly(local_location):
    """LanceDB (its own Lance 13) flushes two rounds of generations with its vector index maintained:

    | level           | rows                                  |
    | base            | ids 0-39 ('base-i')                   |
    | LanceDB round 1 | ids 0-14 updated ('r1-i'), 40-59 new  |
    | LanceDB round 2 | ids 10-24 updated ('r2-i')            |"""
    from support.lancedb_peer import LanceDbTable
    from support.lancedb_peer import rows as peer_rows

    peer = LanceDbTable(local_location)
    peer.create("unsharded", base_ids=range(40), vector=True)
    peer.write_round([peer_rows([*range(15), *range(40, 60)], "r1", vector=True)])
    peer.write_round([peer_rows(range(10, 25), "r2", vector=True)])
    model = {k: r["val"] for k, r in peer.model.items()}
    reader = LsmReader(peer.table.uri)
    assert len(reader.sources) >= 3, "the scenario must span LanceDB's generations"
    for qi, q in enumerate([*QUERIES, vector_of("base-12")]):
        got = reader.search(q, k=10, nprobes=PARTITIONS, refine_factor=len(model) + 1, columns=["id", "val"])
        assert_top_k(_pairs(got), model, np.asarray(q), 10, f"query {qi}")
        assert all(model[r["id"]] == r["val"] for r in got.to_pylist()), "a stale row came back"
