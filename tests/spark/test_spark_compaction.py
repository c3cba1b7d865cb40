"""Compaction and retention on Spark: the compaction tasks run on executors (pickled out, results pickled
back, committed on the driver), in process on the shared session and through real spark-submit."""

from __future__ import annotations

import json

import lance
import pytest
from spark_helpers import Loc, base_rows, build_table, lsm_view

from memwal.compaction import fragment_health
from memwal.mem_wal_index import load_index
from memwal.merge import merge_table
from spark_jobs import compaction as compaction_job
from spark_jobs import retention as retention_job
from spark_jobs import submit

from support.jvm import FAST_JVM

pytestmark = pytest.mark.spark


def test_compaction_tasks_on_executors_then_retention(spark, tmp_path, capfd):
    loc = Loc(str(tmp_path / "t"))
    build_table(loc)
    merge_table(loc.uri, config=None)
    before, merged = lsm_view(loc), dict(load_index(loc.uri).merged_generations)
    fragments = fragment_health(lance.dataset(loc.uri), 1000).fragments
    assert compaction_job.main([loc.uri, "--force", "--target-rows-per-fragment", "1000"]) == 0
    summary = json.loads(capfd.readouterr().out)
    assert summary["job"] == "compaction" and summary["tasks_committed"] >= 1
    assert summary["health_before"]["fragments"] == fragments > summary["health_after"]["fragments"] == 1
    assert lsm_view(loc) == before and dict(load_index(loc.uri).merged_generations) == merged
    assert retention_job.main([loc.uri, "--older-than-s", "0", "--keep-versions", "1"]) == 0
    kept = json.loads(capfd.readouterr().out)
    assert kept["job"] == "retention" and kept["retained_ranges"] == [[lance.dataset(loc.uri).version] * 2]
    assert lsm_view(loc) == before and base_rows(loc)


def test_compaction_through_spark_submit(tmp_path):
    loc = Loc(str(tmp_path / "t"))
    build_table(loc)
    merge_table(loc.uri)
    before = lsm_view(loc)
    summary = submit.run_spark_job("compaction", loc.uri, master="local[2]", conf=FAST_JVM,
                                   extra_args=["--force", "--target-rows-per-fragment", "1000"])
    assert summary["job"] == "compaction" and summary["health_after"]["fragments"] == 1
    assert lsm_view(loc) == before
