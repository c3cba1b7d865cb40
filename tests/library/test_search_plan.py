"""The indexed read plan (memwal.search_plan): the gap (index_catchup, merged] served by the gap generations'
own indexes, the base searched over its indexed fragments only; base rows no gap generation explains (a
write outside MemWAL) searched flat and counted; the default nprobes scaled with the index's partitions."""

from __future__ import annotations

import math
import uuid

import lance
import numpy as np
import pyarrow as pa
import pytest

from memwal import vector_search as vs
from memwal.merge import merge_table
from memwal.reader import LsmReader
from memwal.search_plan import is_vector_index, plan_sources, search_cost
from memwal.storage import lance_storage_options

from support.maintenance import flush_generation
from support.vector_model import PARTITIONS, QUERIES, assert_top_k, create_indexed_base, named_rows, vector_of


def flush(loc, region: str, puts: dict[int, str], deletes=()) -> None:
    flush_generation(loc, region, named_rows(puts) if puts else None, deletes)


@pytest.fixture
def gap(local_location):
    """A maintained IVF_PQ `vec_idx` on base ids 0-299; generations 1 (ids 300-339 new, 100-119 updated, 5-9
    deleted) and 2 (ids 120-129 updated) merged without index catch-up: the gap; generation 3 (ids 0-4, 300-304
    updated) unmerged. Our flush builds `vec_idx` into every generation."""
    loc = local_location
    model = {i: f"b{i}" for i in range(300)}
    create_indexed_base(loc, model)
    region = str(uuid.uuid4())
    gens = [({i: f"g1-{i}" for i in [*range(300, 340), *range(100, 120)]}, range(5, 10)),
            ({i: f"g2-{i}" for i in range(120, 130)}, ())]
    for puts, deletes in gens:
        flush(loc, region, puts, deletes)
        model.update(puts)
        for i in deletes:
            del model[i]
    merge_table(loc.uri)
    gen3 = {i: f"g3-{i}" for i in [*range(0, 5), *range(300, 305)]}
    flush(loc, region, gen3)
    model.update(gen3)
    return loc, model


def _exact(reader: LsmReader, model: dict, q, k: int) -> pa.Table:
    return reader.search(q, k=k, nprobes=PARTITIONS, refine_factor=math.ceil(len(model) / k) + 1)


def _assert_newest(t: pa.Table, model: dict, what: str) -> None:
    rows = t.to_pylist()
    assert len({r["id"] for r in rows}) == len(rows), f"{what}: a key came back twice"
    for r in rows:
        assert model.get(r["id"]) == r["name"], f"{what}: row {r['id']} {r['name']!r} is not its newest version"


def test_the_gap_is_served_by_the_gap_generations_own_indexes(gap):
    loc, _ = gap
    reader = LsmReader(loc.uri)
    planned = plan_sources(reader, "vec", is_vector_index)
    by_gen = {p.source.generation: p for p in planned}
    assert sorted(by_gen) == [0, 1, 2, 3], "the plan does not list the gap generations 1-2 beside the base and 3"
    assert by_gen[0].fast_search and by_gen[0].unindexed_rows == 0, "the base's gap rows are searched flat"
    for gen in (1, 2, 3):
        assert by_gen[gen].index is not None and by_gen[gen].index.name == "vec_idx", f"generation {gen}"
    cost = search_cost(reader, "vec", is_vector_index)
    assert (cost.indexed_sources, cost.flat_sources, cost.rows_served_flat) == (4, 0, 0), cost.to_dict()


def test_search_over_the_gap_is_exact_and_reads_no_row_flat(gap, monkeypatch):
    loc, model = gap
    monkeypatch.setattr(vs, "FLAT_ROWS", 0)  # every generation through its own index
    reader = LsmReader(loc.uri)
    for qi, q in enumerate(QUERIES):
        for k in (1, 10, 400):
            got = _exact(reader, model, q, k)
            _assert_newest(got, model, f"query {qi} k={k}")
            pairs = list(zip(got.column("_distance").to_pylist(), got.column("id").to_pylist(), strict=True))
            assert_top_k(pairs, model, q, min(k, len(model)), f"query {qi}, k={k}")
    plan = reader.last_vector_plan
    assert (plan.indexed_sources, plan.flat_sources, plan.rows_served_flat) == (4, 0, 0), plan.to_dict()


def test_stale_and_deleted_rows_of_the_gap_never_come_back_never_short(gap):
    """Old vectors of rows updated or deleted in the gap (and in the unmerged generation) find only newest
    versions; asking for more than the view holds returns every live row once."""
    loc, model = gap
    reader = LsmReader(loc.uri)
    for name in ("b100", "b7", "g1-300", "b0", "b125"):
        got = reader.search(vector_of(name), k=len(model) + 50)
        _assert_newest(got, model, f"old vector {name}")
        assert sorted(got.column("id").to_pylist()) == sorted(model), "the live rows are not each returned once"
    for k in (3, 10):
        got = reader.search(vector_of("b100"), k=k)
        assert got.num_rows == k, "short result"
        _assert_newest(got, model, f"ANN k={k}")


def test_rows_written_outside_memwal_are_searched_flat_and_counted(gap):
    """Rows appended to the base by plain Lance: no gap generation explains them, so the base is searched with
    its unindexed rows flat (never skipped) and the plan counts them."""
    loc, model = gap
    outside = {i: f"o{i}" for i in range(5000, 5030)}
    lance.write_dataset(named_rows(outside), loc.uri, mode="append",
                        storage_options=lance_storage_options(loc.storage_options))
    model.update(outside)
    reader = LsmReader(loc.uri)
    base = plan_sources(reader, "vec", is_vector_index)[0]
    assert not base.fast_search and base.unindexed_rows >= 30, base
    got = reader.search(vector_of("o5007"), k=1)
    assert got.column("id").to_pylist() == [5007], "a row written outside MemWAL was skipped"
    for qi, q in enumerate(QUERIES):
        got = _exact(reader, model, q, 20)
        _assert_newest(got, model, f"query {qi}")
        pairs = list(zip(got.column("_distance").to_pylist(), got.column("id").to_pylist(), strict=True))
        assert_top_k(pairs, model, q, 20, f"query {qi}")
    assert reader.last_vector_plan.rows_served_flat >= 30, reader.last_vector_plan.to_dict()


@pytest.mark.parametrize("partitions, expected", [(1, 1), (2, 2), (16, 16), (80, 80), (316, 80), (500, 80),
                                                   (1000, 100), (4000, 400)])
def test_default_nprobes_scales_with_the_partitions(partitions, expected):
    assert vs.default_nprobes(partitions) == expected


def test_default_nprobes_probe_every_partition_of_a_small_index(gap):
    """At defaults a 2-partition index is probed whole: with refinement the ANN equals exact search."""
    loc, model = gap
    reader = LsmReader(loc.uri)
    for q in QUERIES:
        got = reader.search(q, k=5, refine_factor=len(model))
        pairs = list(zip(got.column("_distance").to_pylist(), got.column("id").to_pylist(), strict=True))
        assert_top_k(pairs, model, q, 5, "defaults")
    assert np.isfinite(got.column("_distance").to_numpy()).all()
