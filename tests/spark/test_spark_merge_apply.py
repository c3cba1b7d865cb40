"""The merge's fragment apply with its tasks on Spark executors (`spark_jobs.task_runner.spark_runner`):
the same table as the two-pass merge in process, and an executor lost mid-apply costs a retry, never a
half-applied commit."""

from __future__ import annotations

import os
import uuid
from types import SimpleNamespace

import pytest

from memwal import merge_apply
from memwal.merge import MergeConfig, merge_table
from spark_jobs.task_runner import spark_runner

from support.merge_passes import exact_everywhere, lsm_view, passes_table
from support.tables import open_base, view

pytestmark = pytest.mark.spark

GENS = [([20, 21, 5], "g1", [3, 4]), ([3, 7], "g2", [20]), ([21, 0], "g3", [9])]


def _loc(tmp_path) -> SimpleNamespace:
    loc = SimpleNamespace(uri=str(tmp_path / uuid.uuid4().hex), storage_options=None)
    from memwal.storage import ObjectStore

    loc.store = lambda: ObjectStore(loc.uri)
    return loc


def test_the_apply_on_spark_equals_the_two_pass_merge_in_process(spark, tmp_path):
    ours, theirs = _loc(tmp_path), _loc(tmp_path)
    passes_table(ours, GENS, fragment_rows=3)
    passes_table(theirs, GENS, fragment_rows=3)
    model, v0 = lsm_view(ours), open_base(ours).version
    summary = merge_table(ours.uri, config=MergeConfig(max_generations_per_commit=1, apply="fragments"),
                          runner=spark_runner(spark, "test apply"), parallelism=2)
    assert not summary.failed_regions and summary.table_commits == 6, summary  # an Update and a marker each
    merge_table(theirs.uri, config=MergeConfig(max_generations_per_commit=1, apply="passes"))
    exact_everywhere(ours, v0, model)
    assert view(open_base(ours).to_table()) == view(open_base(theirs).to_table()) == model


def test_an_executor_lost_mid_apply_commits_nothing_and_the_merge_retries(spark, tmp_path, monkeypatch):
    """The first apply task's Python worker exits (os._exit) on its first attempt: the Spark job fails, the
    apply raises ApplyTaskError before any commit, the merge retries and ends exact."""
    loc = _loc(tmp_path)
    passes_table(loc, GENS[:1], fragment_rows=3)
    model, v0 = lsm_view(loc), open_base(loc).version
    flag = tmp_path / "died-once"

    def dying(real):
        def task_fn(task):  # a closure: pickled by value for the workers
            if not os.path.exists(flag):
                open(flag, "w").close()
                os._exit(1)
            return real(task)

        return task_fn

    for name in ("apply_fragments", "scan_apply"):  # the apply task of either lookup path
        monkeypatch.setattr(merge_apply, name, dying(getattr(merge_apply, name)))
    summary = merge_table(loc.uri, config=MergeConfig(apply="fragments"), runner=spark_runner(spark), parallelism=2)
    assert flag.exists(), "no task died"
    (region,) = summary.regions
    assert region.generations == [1] and region.conflicts == 1, region
    exact_everywhere(loc, v0, model)


def test_the_spark_merge_job_applies_staged_upserts_on_the_executors(spark, tmp_path):
    """The `spark` engine's merge as spark_jobs/merge.py runs it: the dedup stages the upserts (inline
    results off), the apply's tasks read them on the executors; the driver never opens them."""
    from memwal import merge as merge_module
    from spark_jobs.merge_dedup import spark_dedup
    from spark_jobs.task_runner import default_parallelism

    ours, theirs = _loc(tmp_path), _loc(tmp_path)
    passes_table(ours, GENS, fragment_rows=3)
    passes_table(theirs, GENS, fragment_rows=3)
    model, v0 = lsm_view(ours), open_base(ours).version
    opened, staged = [], []
    base = spark_dedup(spark, inline_bytes=0)

    def wrap(x):
        if isinstance(x, merge_module.MergeInput):
            real = x.open_upserts
            staged.append(len(x.staged))
            x.open_upserts = lambda: opened.append(1) or real()
        return x

    class Recording:
        def __call__(self, refs, pk, schema, store):
            return wrap(base(refs, pk, schema, store))

        def batch(self, batches, pk, schema, store):
            return [wrap(x) for x in base.batch(batches, pk, schema, store)]

    summary = merge_table(ours.uri, config=MergeConfig(max_generations_per_commit=1),  # apply "auto"
                          dedup=Recording(), runner=spark_runner(spark), parallelism=default_parallelism(spark))
    assert not summary.failed_regions and "apply_tasks" in summary.timings_s, summary
    assert staged and all(staged), f"every batch staged its upserts: {staged}"
    assert not opened, "the driver opened staged upserts"
    merge_table(theirs.uri, config=MergeConfig(max_generations_per_commit=1, apply="passes"))
    exact_everywhere(ours, v0, model)
    assert view(open_base(ours).to_table()) == view(open_base(theirs).to_table()) == model


def test_an_older_generation_merged_between_our_update_and_marker_on_spark_is_merged_again(spark, tmp_path,
                                                                                          monkeypatch):
    """Issue 32 on the Spark engine (the commit sequence runs on the driver; the tasks on executors): gen 1
    updates key 5, gen 2 updates 5 and inserts fresh 50000; right after our marker commit's progress check,
    Lance core's own merger merges gen 1 (its key 5 over our gen 2 row, marker 1). Our marker step (1) is
    refused as stale; the merge replans from 1 and merges gen 2 again: key 5 ends with gen 2's row."""
    from lance.mem_wal import CompactedSsTable

    from memwal import merge_commit

    from support.tables import rows

    loc = _loc(tmp_path)
    region = passes_table(loc, [([5], "g1", []), ([5, 50000], "g2", [])])
    model, v0 = lsm_view(loc), open_base(loc).version
    real, calls = merge_commit.check_progress, []

    def hooked(table, since):
        real(table, since)
        calls.append(1)
        if len(calls) == 1:  # the marker commit's check, after our Update
            (open_base(loc).merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
             .mark_sstables_as_compacted([CompactedSsTable(region, 1)]).execute(rows([5], "g1")))

    monkeypatch.setattr(merge_commit, "check_progress", hooked)
    summary = merge_table(loc.uri, config=MergeConfig(max_generations_per_commit=2, apply="fragments"),
                          runner=spark_runner(spark, "test window"), parallelism=2)
    assert not summary.failed_regions and summary.regions[0].conflicts == 1, summary
    assert view(open_base(loc).to_table())[5] == ("g25", 2.5), "gen 2's row of key 5 must win"
    exact_everywhere(loc, v0, model)
