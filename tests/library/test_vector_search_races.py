"""Searches while merge, index catch-up and GC move the table on: at each of their fault points (hooked here,
not crashing) a search from a fresh reader returns every live row exactly once at its newest version, and GC
keeps the generations in an index's gap (merged, index not caught up) until catch-up covers them."""

from __future__ import annotations

import uuid
from datetime import timedelta

import lance
import pytest
from test_vector_search import create_base, flush

from memwal import gc, merge, merge_commit, naming
from memwal import table as table_module
from memwal.catchup import catchup_table
from memwal.gc import GcConfig, gc_table
from memwal.merge import merge_table
from memwal.reader import LsmReader
from memwal.storage import lance_storage_options

from support.vector_model import PARTITIONS, QUERIES, assert_top_k, vector_of


@pytest.fixture
def table(local_location):
    """| level                | rows                                    |
    | base (IVF_PQ)        | ids 0-299 'b{i}'                        |
    | generation 1         | ids 300-339 new, 100-119 updated        |
    | generation 2         | ids 0-59 updated, 60-69 deleted         |"""
    loc = local_location
    model = {i: f"b{i}" for i in range(300)}
    create_base(loc, model, maintained=True)
    region = str(uuid.uuid4())
    gen1 = {i: f"g1-{i}" for i in [*range(300, 340), *range(100, 120)]}
    flush(loc, region, gen1)
    model.update(gen1)
    gen2 = {i: f"g2-{i}" for i in range(0, 60)}
    flush(loc, region, gen2, deletes=range(60, 70))
    model.update(gen2)
    for i in range(60, 70):
        del model[i]
    return loc, region, model


def check_search(uri: str, model: dict, what: str) -> None:
    """Every live row once, newest version, exact order; and the 5 nearest to a stale vector."""
    reader = LsmReader(uri)
    for q in (*QUERIES, vector_of("b0")):
        got = reader.search(q, k=len(model) + 10, nprobes=PARTITIONS, refine_factor=len(model) + 10,
                            columns=["id", "name"])
        rows = got.to_pylist()
        assert sorted(r["id"] for r in rows) == sorted(model), f"{what}: a live row missing or a key twice"
        assert all(model[r["id"]] == r["name"] for r in rows), f"{what}: a stale version came back"
        pairs = list(zip(got.column("_distance").to_pylist(), got.column("id").to_pylist(), strict=True))
        assert_top_k(pairs, model, q, len(model), what)
        ann = reader.search(q, k=5, columns=["id", "name"]).to_pylist()
        assert len(ann) == 5 and all(model[r["id"]] == r["name"] for r in ann), f"{what}: ANN short or stale"


def _hook(monkeypatch, module, uri: str, model: dict, hits: list[str]) -> None:
    def hooked(name: str) -> None:
        hits.append(name)
        check_search(uri, model, f"search at {name}")

    monkeypatch.setattr(module, "fault_point", hooked)


def test_searches_during_merge_catchup_and_gc_never_miss_or_return_stale_rows(table, monkeypatch):
    loc, _, model = table
    hits: list[str] = []
    for module in (merge, merge_commit, table_module, gc):
        _hook(monkeypatch, module, loc.uri, model, hits)
    check_search(loc.uri, model, "before the merge")
    assert not merge_table(loc.uri).failed_regions
    check_search(loc.uri, model, "merged, index not caught up")
    catchup_table(loc.uri)
    check_search(loc.uri, model, "caught up")
    lance.dataset(loc.uri, storage_options=lance_storage_options(loc.storage_options)).cleanup_old_versions(
        older_than=timedelta(0))
    summary = gc_table(loc.uri, config=GcConfig(keep_manifest_versions=1))
    assert summary.to_dict()["deleted"]["generation"] == 2, summary.to_dict()
    check_search(loc.uri, model, "after GC")
    for point in ("merge.between_passes", "merge.after_commit", "details.after_commit",
                  "gc.after_manifest_prune", "gc.mid_delete"):
        assert point in hits, f"the search never ran at {point}: {sorted(set(hits))}"


def test_gc_keeps_a_gap_generation_until_its_index_catches_up(table):
    """Merged but the vector index not caught up: GC keeps both generations (index_catchup), and the search
    stays exact; after catch-up GC removes them and the search is unchanged."""
    loc, region, model = table
    assert not merge_table(loc.uri).failed_regions
    lance.dataset(loc.uri, storage_options=lance_storage_options(loc.storage_options)).cleanup_old_versions(
        older_than=timedelta(0))
    summary = gc_table(loc.uri, config=GcConfig(keep_manifest_versions=1))
    kept = summary.regions[0]
    assert kept.limited_by.startswith("index_catchup[vec_idx]"), summary.to_dict()
    store = loc.store()
    assert len([d for d in store.list_dirs(naming.region_dir(region)) if "_gen_" in d]) == 2
    check_search(loc.uri, model, "gap generations kept")
    catchup_table(loc.uri)
    gc_table(loc.uri, config=GcConfig(keep_manifest_versions=1))
    assert [d for d in store.list_dirs(naming.region_dir(region)) if "_gen_" in d] == []
    check_search(loc.uri, model, "gap generations collected after catch-up")
