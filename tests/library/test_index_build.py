"""Catch-up's distributed index build (memwal.index_build) with the in-process runner, on real Lance tables:
each index type gets 2+ segments over fragment groups committed together, searches equal brute force,
Lance reports no unindexed rows, index_catchup is recorded by catch-up's rule; IVF segments share the
existing model (Lance then folds them); what Lance cannot build per group falls back to optimize_indices."""

from __future__ import annotations

import os

import lance
import pytest

from memwal import index_build
from memwal.catchup import DistributedBuild, catchup_table
from memwal.index_segments import segment_counts
from memwal.maintenance_config import IndexPolicy
from memwal.mem_wal_index import load_index
from memwal.table import MemWalTable
from memwal.task_runner import in_process

from support.index_tables import INDEXES, append, create_index_table, search_results

BASE, NEW = 2000, 3000


def tasks(**kw) -> DistributedBuild:
    """Every index with rows to index goes to the runner, in groups of at least 500 rows."""
    return DistributedBuild(**{"runner": in_process, "groups": 3, "where": "tasks", "min_rows": 0,
                               "min_group_rows": 500, **kw})


def unreferenced_segments(loc, ds: lance.LanceDataset) -> set[str]:
    """Segment directories under _indices/ that no index of ds's version references."""
    on_disk = {m.path.split("/")[1] for m in loc.store().list("_indices")}
    return on_disk - {str(s.uuid) for d in ds.describe_indices() for s in d.segments}


def _ds(loc) -> lance.LanceDataset:
    return MemWalTable(loc.uri, loc.storage_options).refresh().dataset


def test_plan_groups_are_disjoint_balanced_and_cover_every_fragment():
    groups = index_build.plan_groups({1: 100, 2: 900, 3: 500, 4: 400, 5: 100}, 2)
    assert sorted(f for g in groups for f in g) == [1, 2, 3, 4, 5]
    loads = sorted(sum({1: 100, 2: 900, 3: 500, 4: 400, 5: 100}[f] for f in g) for g in groups)
    assert loads == [1000, 1000]
    assert index_build.plan_groups({7: 10}, 4) == [[7]], "never more groups than fragments"


@pytest.mark.parametrize("name", list(INDEXES))
def test_each_type_is_built_as_segments_over_fragment_groups(local_location, name):
    loc = local_location
    create_index_table(loc, BASE, {name: INDEXES[name]})
    append(loc, BASE, BASE + NEW)
    v0 = _ds(loc).version
    summary = catchup_table(loc.uri, distributed=tasks())
    (result,) = summary.indexes
    assert result.error is None and result.covered, result
    assert result.where == "tasks" and result.segments_built == 3 and result.rows_to_index == NEW, result
    ds = _ds(loc)
    assert segment_counts(ds)[name] == 1 + 3, "three new segments joined the index"
    described = next(d for d in ds.describe_indices() if d.name == name)
    new = [sorted(int(f) for f in s.fragment_ids) for s in described.segments[1:]]
    assert sorted(f for g in new for f in g) == list(range(2, 2 + NEW // 500)), "disjoint groups, every fragment"
    search_results(ds, (name,))
    assert result.caught_up_generations == dict(load_index(loc.uri).details.merged_generations)
    assert summary.read_version == v0 and ds.version == v0 + 1, "one commit: the segments together"


def test_ivf_segments_share_the_trained_model_so_lance_folds_them(local_location):
    """The fold reads each segment's quantizer: Lance refuses segments whose centroids or codebook differ
    ("do not share quantizer metadata"), so the fold succeeding proves the model was passed through."""
    loc = local_location
    create_index_table(loc, BASE, {"vec_idx": INDEXES["vec_idx"]})
    before = index_build.vector_model(_ds(loc), "vec_idx")
    append(loc, BASE, BASE + NEW)
    result = catchup_table(loc.uri, policy=IndexPolicy(max_segments=1), distributed=tasks()).indexes[0]
    assert result.error is None and result.segments_built == 3 and result.folded_segments == 4, result
    ds = _ds(loc)
    assert segment_counts(ds)["vec_idx"] == 1
    after = index_build.vector_model(ds, "vec_idx")
    assert (after["ivf_centroids"] == before["ivf_centroids"]).all()
    assert (after["pq_codebook"] == before["pq_codebook"]).all()
    search_results(ds, ("vec_idx",))


def test_every_type_at_once_policy_folds_after_the_append(local_location):
    loc = local_location
    create_index_table(loc, BASE)
    append(loc, BASE, BASE + NEW)
    summary = catchup_table(loc.uri, policy=IndexPolicy(max_segments=2), distributed=tasks())
    assert all(r.error is None and r.covered and r.where == "tasks" for r in summary.indexes), summary
    ds = _ds(loc)
    assert max(segment_counts(ds).values()) <= 2
    search_results(ds)


def test_small_work_and_unsupported_types_stay_in_process(local_location):
    loc = local_location
    create_index_table(loc, BASE, {"id_idx": INDEXES["id_idx"],
                                   "sq_idx": ("vec", "IVF_SQ", {"num_partitions": 4})})
    append(loc, BASE, BASE + NEW)
    summary = catchup_table(loc.uri, distributed=tasks(min_rows=NEW + 1))
    assert {r.index_name: r.where for r in summary.indexes} == {"id_idx": "in_process", "sq_idx": "in_process"}
    assert all("under the distributed threshold" in r.why for r in summary.indexes)
    append(loc, BASE + NEW, BASE + NEW + 1000)
    summary = catchup_table(loc.uri, distributed=tasks())
    by = {r.index_name: r for r in summary.indexes}
    assert by["id_idx"].where == "tasks" and by["sq_idx"].where == "in_process", summary
    assert "scalar quantizer" in by["sq_idx"].why and by["sq_idx"].covered
    assert _ds(loc).stats.index_stats("sq_idx")["num_unindexed_rows"] == 0


def test_a_failed_task_leaves_the_index_as_it_was(local_location):
    loc = local_location
    create_index_table(loc, BASE, {"id_idx": INDEXES["id_idx"]})
    append(loc, BASE, BASE + NEW)
    before = _ds(loc)
    calls = []

    def failing(fn, items):
        out = []
        for item in items:
            if len(calls) == 1:
                raise OSError("executor lost")
            calls.append(item)
            out.append(fn(item))
        return out

    result = catchup_table(loc.uri, distributed=tasks(runner=failing)).indexes[0]
    assert result.error and "executor lost" in result.error and not result.covered
    ds = _ds(loc)
    assert ds.version == before.version, "nothing committed"
    assert segment_counts(ds) == segment_counts(before)
    assert "id_idx" not in load_index(loc.uri).details.index_catchup
    assert unreferenced_segments(loc, ds) and len(calls) == 1, "the finished task's segment: written, unreferenced"
    assert catchup_table(loc.uri, distributed=tasks()).indexes[0].covered, "the next run builds it"
    search_results(_ds(loc), ("id_idx",))


def test_tasks_size_lances_threads_to_the_task_cores(local_location, monkeypatch):
    loc = local_location
    create_index_table(loc, BASE, {"id_idx": INDEXES["id_idx"]})
    append(loc, BASE, BASE + 1000)
    monkeypatch.delenv("LANCE_CPU_THREADS", raising=False)
    seen = []

    def recording(fn, items):
        seen.extend((item.threads, item.fragment_ids) for item in items)
        return in_process(fn, items)

    assert catchup_table(loc.uri, distributed=tasks(runner=recording, threads=3)).indexes[0].covered
    assert [t for t, _ in seen] == [3, 3]
    assert os.environ["LANCE_CPU_THREADS"] == "3", "set before the task's Lance work"


def test_the_threshold_is_by_kind(local_location, monkeypatch):
    loc = local_location
    create_index_table(loc, BASE, {"vec_idx": INDEXES["vec_idx"], "id_idx": INDEXES["id_idx"]})
    append(loc, BASE, BASE + NEW)
    monkeypatch.setitem(index_build.DISTRIBUTED_MIN_ROWS, "vector", NEW)
    monkeypatch.setitem(index_build.DISTRIBUTED_MIN_ROWS, "scalar", NEW + 1)
    by = {r.index_name: r for r in catchup_table(loc.uri, distributed=tasks(min_rows=None)).indexes}
    assert by["vec_idx"].where == "tasks" and by["vec_idx"].why == f"{NEW} rows to index, at least {NEW}"
    assert by["id_idx"].where == "in_process" and f"threshold of {NEW + 1}" in by["id_idx"].why
    assert all(r.covered for r in by.values())


def test_on_s3_the_model_and_segments_go_through_the_storage_options(s3_location):
    """The PQ codebook is read from the segment's auxiliary.idx and the tasks open the table with the
    table's storage options (a moto endpoint: without them nothing is found)."""
    loc = s3_location
    create_index_table(loc, BASE, {"vec_idx": INDEXES["vec_idx"], "text_idx": INDEXES["text_idx"]})
    append(loc, BASE, BASE + NEW)
    summary = catchup_table(MemWalTable(loc.uri, loc.storage_options), distributed=tasks())
    assert all(r.error is None and r.covered and r.segments_built == 3 for r in summary.indexes), summary
    search_results(_ds(loc), ("vec_idx", "text_idx"))
