"""Catch-up's distributed index build raced, deterministically: the TaskRunner runs the other party's
commit (a merge, a compaction, GC) at an exact moment — between two segment tasks, or after the last task
before the segments' commit at V0. A merge after V0 leaves its rows to the next catch-up and index_catchup is
recorded as of V0 only; a compaction that rewrote the planned fragments makes Lance refuse the commit (the
index as it was, nothing recorded); searches always equal the model."""

from __future__ import annotations

from collections.abc import Callable

import lance
import numpy as np

from memwal.catchup import DistributedBuild, catchup_table
from memwal.compaction import compact_table
from memwal.gc import GcConfig, gc_table
from memwal.index_segments import segment_counts
from memwal.maintenance_config import CompactionConfig, IndexPolicy
from memwal.mem_wal_index import load_index
from memwal.merge import MergeConfig, merge_table
from memwal.table import MemWalTable

from support.vector_tables import create_vector_table, text_of, vectors, write_generation

BASE = 2000
NAMES = ("vec_idx", "text_idx", "id_idx")


def _runner(between: Callable[[], None], after: Callable[[], None]) -> Callable:
    """A TaskRunner (in process) that, on its first use (the first index's build), runs `between` after the
    first task and `after` after the last."""
    calls = []

    def run(fn, tasks):
        calls.append(len(tasks))
        out = []
        for i, task in enumerate(tasks):
            out.append(fn(task))
            if i == 0 and len(calls) == 1:
                between()
        if len(calls) == 1:
            after()
        return out

    return run


def _build(runner) -> DistributedBuild:
    return DistributedBuild(runner, groups=2, where="tasks", min_rows=0, min_group_rows=1)


def _ds(loc) -> lance.LanceDataset:
    return MemWalTable(loc.uri, loc.storage_options).refresh().dataset


def _check(ds: lance.LanceDataset, model: dict[int, int]) -> None:
    ids = np.array(sorted(model))
    matrix = np.concatenate([vectors([i], model[i]) for i in ids])
    q = np.random.default_rng(7).standard_normal(16).astype("float32")
    expected = ids[np.argsort(((matrix - q) ** 2).sum(axis=1), kind="stable")[:10]].tolist()
    partitions = max(s["num_partitions"] for s in ds.stats.index_stats("vec_idx")["segments"])
    ann = ds.to_table(columns=["id"], nearest={"column": "vec", "q": q, "k": 10, "nprobes": partitions,
                                               "refine_factor": len(ids)})["id"].to_pylist()
    assert ann == expected
    for i in (5, BASE + 3, max(model)):
        hits = ds.to_table(columns=["id"], full_text_query=f"doc{i}v{model.get(i, 0)}")["id"].to_pylist()
        assert hits == [i], (i, hits)
    assert sorted(ds.to_table(columns=["id"], filter="id >= 1990")["id"].to_pylist()) == [i for i in ids if i >= 1990]
    apple = sorted(i for i, v in model.items() if "apple" in text_of(i, v).split())
    assert sorted(ds.to_table(columns=["id"], full_text_query="apple")["id"].to_pylist()) == apple


def _merged(loc, region: str, model: dict[int, int], ids, version: int) -> None:
    write_generation(loc, region, ids, version)
    merge_table(loc.uri, config=MergeConfig(max_generations_per_commit=1))
    model.update(dict.fromkeys(ids, version))


def _table(loc) -> tuple[str, dict[int, int]]:
    """Base rows indexed; then three merged generations (new rows and upserts) no index covers."""
    (region,) = create_vector_table(loc, BASE)
    model = dict.fromkeys(range(BASE), 0)
    for g in range(3):
        _merged(loc, region, model, [*range(BASE + 100 * g, BASE + 100 * g + 100), g], g + 1)
    return region, model


def test_build_while_merges_commit_records_only_what_v0_had(local_location):
    loc = local_location
    region, model = _table(loc)
    v0_merged = dict(load_index(loc.uri).details.merged_generations)

    summary = catchup_table(loc.uri, distributed=_build(_runner(
        lambda: _merged(loc, region, model, [*range(BASE + 300, BASE + 350), 10], 4),
        lambda: _merged(loc, region, model, [*range(BASE + 350, BASE + 400), 11], 5))))
    assert all(r.error is None and r.covered and r.segments_built == 2 for r in summary.indexes), summary
    details = load_index(loc.uri).details
    assert dict(details.merged_generations) == {region: 5}
    assert all(details.index_catchup[n] == v0_merged for n in NAMES), "recorded as of V0, not the merges after"
    ds = _ds(loc)
    assert all(ds.stats.index_stats(n)["num_unindexed_rows"] > 0 for n in NAMES), "the later merges' rows"
    _check(ds, model)
    catchup_table(loc.uri)
    assert all(load_index(loc.uri).details.index_catchup[n] == {region: 5} for n in NAMES)
    _check(_ds(loc), model)


def test_build_while_a_compaction_rewrites_the_fragments_commits_nothing(local_location):
    loc = local_location
    _region, model = _table(loc)
    before = segment_counts(_ds(loc))
    compacted = []

    def compaction() -> None:
        summary = compact_table(loc.uri, CompactionConfig(force=True, target_rows_per_fragment=100_000))
        assert summary.error is None and summary.health_after["fragments"] < summary.health_before["fragments"]
        compacted.append(summary)

    summary = catchup_table(loc.uri, policy=IndexPolicy(max_segments=None),
                            distributed=_build(_runner(lambda: None, compaction)))
    assert compacted
    # every index's commit is at the same V0, which the compaction rewrote: Lance refuses each (preempted)
    assert all(r.error is None and not r.covered and r.segments_built == 0 for r in summary.indexes), summary
    assert segment_counts(_ds(loc)) == before, "the indexes as they were"
    assert summary.table_version_after == compacted[0].table_version_after, "nothing committed after compaction"
    _check(_ds(loc), model)
    rerun = catchup_table(loc.uri, distributed=_build(_runner(lambda: None, lambda: None)))
    assert all(r.covered for r in rerun.indexes), rerun
    _check(_ds(loc), model)


def test_build_while_a_merge_a_compaction_and_gc_commit(local_location):
    loc = local_location
    region, model = _table(loc)

    def merge_then_gc() -> None:
        _merged(loc, region, model, [*range(BASE + 300, BASE + 320), 12], 4)
        gc_table(loc.uri, config=GcConfig(grace_period_s=0, keep_manifest_versions=1))

    def compaction() -> None:
        assert compact_table(loc.uri, CompactionConfig(force=True, target_rows_per_fragment=100_000)).error is None

    catchup_table(loc.uri, distributed=_build(_runner(merge_then_gc, compaction)))
    _check(_ds(loc), model)
    for _ in range(2):
        summary = catchup_table(loc.uri, distributed=_build(_runner(lambda: None, lambda: None)))
    assert all(r.covered and not r.error for r in summary.indexes), summary
    assert all(_ds(loc).stats.index_stats(n)["num_unindexed_rows"] == 0 for n in NAMES)
    _check(_ds(loc), model)
