"""memwal.engines: the plan made before any Spark starts, and where it sends each job. A job without executor
work runs in process whatever the engine (no spark-submit, no Spark Connect session); `auto` follows the
thresholds; the summary says where each part ran and why."""

from __future__ import annotations

import json

import pytest

import spark_jobs.connect
import spark_jobs.submit
from memwal.cli import main
from memwal.engines import AutoThresholds, choose_engine, plan_work
from memwal.job_config import JobOptions
from memwal.maintenance_config import CompactionConfig
from memwal.table import MemWalTable

from support.maintenance import build_table


@pytest.fixture
def no_spark(monkeypatch):
    """Any start of spark-submit or of a Spark Connect session fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a job without executor work started Spark")

    monkeypatch.setattr(spark_jobs.submit, "run_spark_job", refuse)
    monkeypatch.setattr(spark_jobs.connect, "connect_session", refuse)


def _cli(argv, capsys) -> dict:
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("engine", [["--spark"], ["--spark-connect", "sc://127.0.0.1:1"]])
def test_driver_only_jobs_start_no_spark(local_location, capsys, no_spark, engine):
    """Retention and GC always run in process; compaction not due, a merge with nothing pending and catch-up
    with nothing to index too. Rule: no Spark start (refused above), and the summary says in_process and why."""
    loc = local_location
    build_table(loc, regions=1, generations=1)
    for job, extra in (("retention", []), ("gc", []), ("compaction", []), ("catchup", [])):
        summary = _cli([job, loc.uri, *engine, *extra], capsys)
        assert summary["engine"] == "in_process", (job, summary)
        assert summary["ran_on"]["plan"] == "in_process" and "in_process" in summary["ran_on"].values()
        assert summary["engine_reason"].startswith("no executor work"), summary["engine_reason"]
    # Merge everything in process, then a merge on a Spark engine finds no batch to deduplicate.
    assert main(["merge", loc.uri]) == 0
    capsys.readouterr()
    summary = _cli(["merge", loc.uri, *engine], capsys)
    assert summary["ran_on"] == {"plan": "in_process", "driver": "in_process", "dedup": "in_process"}
    assert summary["plan"]["reason"] == "no generation to merge" and summary["generations_merged"] == 0


def test_plan_finds_executor_work(local_location):
    """A merge with pending generations, a due (or forced) compaction: executor work, sized."""
    loc = local_location
    build_table(loc, regions=2, generations=3)
    table = MemWalTable(loc.uri)
    merge = plan_work("merge", table, JobOptions())
    assert merge.executor_work and merge.facts["region_batches"] == 2 and merge.facts["generations"] == 6
    assert merge.facts["backlog_bytes"] > 0
    assert choose_engine("spark_connect", merge).engine == "spark_connect"
    assert choose_engine("spark", merge).engine == "spark"
    assert choose_engine("in_process", merge).engine == "in_process"
    forced = plan_work("compaction", table, JobOptions(compaction=CompactionConfig(force=True)))
    assert not forced.executor_work or forced.facts["fragments"] > 1
    assert not plan_work("retention", table, JobOptions()).executor_work


def test_catch_up_has_executor_work_only_for_segments_big_enough_to_build_there(local_location, monkeypatch):
    """Rows an index does not cover: driver work under the index kind's threshold for segments built on the
    executors (memwal.index_build.DISTRIBUTED_MIN_ROWS), executor work at or over it."""
    from memwal import index_build
    from memwal.merge import merge_table

    from support.tables import open_base

    loc = local_location
    build_table(loc, regions=2, generations=3)
    open_base(loc).create_scalar_index("name", "BTREE", name="name_idx")
    merge_table(loc.uri)
    table = MemWalTable(loc.uri)
    small = plan_work("catchup", table, JobOptions())
    rows = small.facts["rows_to_index"]
    assert rows > 0 and not small.executor_work and "under every index's threshold" in small.reason, small
    assert choose_engine("spark", small).engine == "in_process", "no Spark application for a small catch-up"
    monkeypatch.setitem(index_build.DISTRIBUTED_MIN_ROWS, "scalar", rows)
    large = plan_work("catchup", table, JobOptions())
    assert large.executor_work and large.facts["indexes_to_build_on_executors"] == ["name_idx"], large
    assert choose_engine("spark", large).engine == "spark"


def test_auto_follows_the_thresholds(local_location):
    """auto: in process under every threshold, the table's Spark engine at or over one; the reason says so."""
    loc = local_location
    build_table(loc, regions=2, generations=3)
    plan = plan_work("merge", MemWalTable(loc.uri), JobOptions())
    small = choose_engine("auto", plan)
    assert small.engine == "in_process" and small.reason.startswith("auto: small work")
    low = AutoThresholds(backlog_bytes=plan.facts["backlog_bytes"])
    large = choose_engine("auto", plan, thresholds=low, spark_engine="spark")
    assert large.engine == "spark" and "backlog bytes" in large.reason
    just_over = AutoThresholds(backlog_bytes=plan.facts["backlog_bytes"] + 1)
    assert choose_engine("auto", plan, thresholds=just_over).engine == "in_process"


def test_auto_on_the_cli_runs_small_work_in_process(local_location, capsys, no_spark):
    loc = local_location
    build_table(loc, regions=1, generations=2)
    summary = _cli(["merge", loc.uri, "--spark-connect", "sc://127.0.0.1:1", "--auto"], capsys)
    assert summary["engine_requested"] == "auto" and summary["engine"] == "in_process"
    assert summary["generations_merged"] == 2 and summary["ran_on"]["dedup"] == "in_process"


def test_an_unreachable_connect_server_is_one_line_naming_the_url(local_location, capsys):
    """A merge with work on a Spark Connect URL where nothing listens: exit 1, one line naming the URL;
    nothing merged, so the retry (once the server is up) merges everything."""
    loc = local_location
    build_table(loc, regions=1, generations=2)
    from spark_jobs.connect_server import free_local_port

    url = f"sc://127.0.0.1:{free_local_port()}"
    assert main(["merge", loc.uri, "--spark-connect", url]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and url in err and "not reachable" in err, err
    assert MemWalTable(loc.uri).index.details.merged_generations == {} or not any(
        MemWalTable(loc.uri).index.details.merged_generations.values())
    assert main(["merge", loc.uri]) == 0  # the retry resumes (here in process)


def test_the_shared_session_id_follows_the_code_and_the_period():
    """Every client of one code version attaches to one session per period; another code version or
    period gets another session; the connection's parameters (a token) are kept."""
    from spark_jobs.connect import SESSION_PERIOD_S, redact_url, shared_session_url

    a = shared_session_url("sc://h:15002", "/c/memwal-code-aaa.zip", now=10.0)
    assert a == shared_session_url("sc://h:15002/", "/other/memwal-code-aaa.zip", now=SESSION_PERIOD_S - 1)
    assert a.startswith("sc://h:15002/;session_id=")
    assert a != shared_session_url("sc://h:15002", "/c/memwal-code-bbb.zip", now=10.0)
    assert a != shared_session_url("sc://h:15002", "/c/memwal-code-aaa.zip", now=SESSION_PERIOD_S + 1)
    with_token = shared_session_url("sc://h:15002/;token=s3cret", "/c/memwal-code-aaa.zip", now=10.0)
    assert with_token.startswith("sc://h:15002/;token=s3cret;session_id=")
    assert "s3cret" not in redact_url(with_token) and "token=***" in redact_url(with_token)
