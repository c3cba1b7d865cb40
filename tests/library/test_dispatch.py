"""memwal.engines.dispatch: the one path plan -> choose -> run -> record, with the runners injected. The
chosen engine's runner runs the job and gets the job, the handle, the typed options and the regions; a job
without executor work runs in process whatever runners are given; the summary records where and why."""

from __future__ import annotations

import pytest

from memwal.engines import dispatch, in_process, load_runner
from memwal.errors import MemWalError
from memwal.job_config import JobOptions
from memwal.table import MemWalTable

from support.maintenance import build_table


class Recording:
    """A runner that records its calls and returns a canned summary (no Spark)."""

    def __init__(self, summary: dict | None = None) -> None:
        self.calls: list[tuple] = []
        self.summary = summary if summary is not None else {"job": "merge", "generations_merged": 0}

    def __call__(self, job, table, options, regions):
        self.calls.append((job, table, options, regions))
        return dict(self.summary)


def test_the_chosen_engine_runs_the_job_on_its_injected_runner(local_location):
    """Two regions with pending generations, engine spark: the spark runner runs the merge (given the handle,
    the options and the regions as passed) and the summary records spark for the dedup, and why."""
    ids = build_table(local_location, regions=2, generations=2)
    table, options = MemWalTable(local_location.uri), JobOptions()
    spark, connect = Recording(), Recording()
    summary = dispatch("merge", table, options, ids[:1], engine="spark",
                       runners={"spark": spark, "spark_connect": connect})
    assert spark.calls == [("merge", table, options, ids[:1])], "the chosen engine's runner runs the job, once"
    assert connect.calls == [], "another engine's runner never runs"
    assert summary["ran_on"] == {"plan": "in_process", "driver": "spark", "dedup": "spark"}
    assert summary["engine"] == "spark" and summary["engine_requested"] == "spark"
    assert summary["plan"]["executor_work"] and summary["plan"]["facts"]["region_batches"] == 1


def test_no_executor_work_runs_in_process_whatever_the_runners(local_location):
    """GC is driver-only: with a spark runner given, the job still runs here (the library's own runner) and
    the summary is the in-process run's, with in_process and the reason recorded."""
    build_table(local_location, regions=1, generations=1)
    table = MemWalTable(local_location.uri)
    spark = Recording()
    summary = dispatch("gc", table, JobOptions(), engine="spark", runners={"spark": spark})
    assert spark.calls == [], "a job without executor work must not start Spark"
    assert summary["job"] == "gc" and summary["engine"] == "in_process"
    assert summary["engine_reason"] == "no executor work: gc runs on the driver only"


def test_an_injected_in_process_runner_replaces_the_default(local_location):
    """The caller's in_process runner (the Airflow hook's wraps errors as task errors) is the one used."""
    build_table(local_location, regions=1, generations=1)
    mine = Recording({"job": "gc"})
    summary = dispatch("gc", MemWalTable(local_location.uri), JobOptions(), engine="in_process",
                       runners={"in_process": mine})
    assert len(mine.calls) == 1 and summary["engine"] == "in_process"


def test_on_choice_hears_the_plan_and_choice_before_the_run(local_location):
    ids = build_table(local_location, regions=1, generations=2)
    events: list[str] = []

    def runner(job, table, options, regions):
        events.append("run")
        return {"job": job}

    def on_choice(plan, choice):
        events.append(f"choice {choice.engine} ({plan.job}: {plan.reason})")

    dispatch("merge", MemWalTable(local_location.uri), JobOptions(), ids, engine="spark_connect",
             runners={"spark_connect": runner}, on_choice=on_choice)
    assert len(events) == 2 and events[1] == "run", "the choice is told once, before the runner runs"
    assert events[0].startswith("choice spark_connect (merge: 2 generation(s)"), events[0]


def test_a_chosen_engine_without_a_runner_is_refused_before_anything_runs(local_location):
    build_table(local_location, regions=1, generations=2)
    with pytest.raises(ValueError, match="engine 'spark' was chosen but no runner was given"):
        dispatch("merge", MemWalTable(local_location.uri), JobOptions(), engine="spark", runners={})


def test_a_plan_error_propagates_and_no_runner_runs(tmp_path):
    """A missing table fails in the plan, as raised (the CLI and the hook word it), and nothing runs."""
    spark = Recording()
    with pytest.raises(MemWalError):
        dispatch("merge", MemWalTable(str(tmp_path / "missing")), JobOptions(), engine="spark",
                 runners={"spark": spark})
    assert spark.calls == []


def test_in_process_is_the_library_run(local_location):
    """The default runner is memwal.jobs.run_job: a merge merges every pending generation."""
    ids = build_table(local_location, regions=1, generations=2)
    table = MemWalTable(local_location.uri)
    summary = in_process("merge", table, JobOptions(), None)
    assert summary["generations_merged"] == 2
    assert table.refresh().index.details.merged_generation(ids[0]) == 2


def test_load_runner_finds_the_installed_spark_runners_by_engine_name():
    """The Spark engines' runners come from the `memwal.runners` entry points (the library names no module
    above it): built with their settings; an engine nobody registered is one line naming the group."""
    spark = load_runner("spark", master="local[1]", conf={"spark.executor.memory": "1g"})
    assert type(spark).__name__ == "SparkSubmitRunner" and spark.master == "local[1]"
    assert spark.conf == {"spark.executor.memory": "1g"}
    connect = load_runner("spark_connect", url="sc://h:15002")
    assert type(connect).__name__ == "ConnectRunner" and connect.url == "sc://h:15002"
    with pytest.raises(MemWalError, match=r"memwal\.runners"):
        load_runner("flink")
