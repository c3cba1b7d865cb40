"""MemWalHook.run_job goes through memwal.engines.dispatch with its own runners (errors as task errors), and
reads the Spark master from the connection's public fields (`spark_master`), not the provider's private
state."""

from __future__ import annotations

import pytest
from airflow.sdk import Connection
from airflow.sdk.exceptions import AirflowFailException

from memwal.airflow.hooks.memwal import MemWalHook, MemWalTaskError, spark_master
from memwal.job_config import JobOptions
from memwal.table import MemWalTable

from support.maintenance import build_table


@pytest.mark.parametrize(("conn_type", "host", "port", "master"), [
    ("spark", "local[*]", None, "local[*]"),  # a whole master URL in the host (the UI's form)
    ("spark", "spark://h", 7077, "spark://h:7077"),
    ("spark", "h", 7077, "spark://h:7077"),  # no scheme and a port: the type is the scheme
    ("spark", "yarn", None, "yarn"),
    ("spark", "k8s://https://api.k8s", 443, "k8s://https://api.k8s:443"),
])
def test_the_master_comes_from_the_connections_public_fields(conn_type, host, port, master):
    conn = Connection(conn_id="s", conn_type=conn_type, host=host, port=port)
    assert spark_master(conn) == master, "the Spark provider's rule for a spark connection's master"


def test_work_without_executor_work_never_touches_the_spark_connection(local_location):
    """engine spark, nothing to merge: the dispatcher runs the job in process, so a Spark connection that
    does not exist is never looked up; the summary says in_process and why."""
    build_table(local_location, regions=1, generations=1)
    hook = MemWalHook(memwal_conn_id=None)
    hook.run_job("merge", local_location.uri, engine="in_process")  # merge everything first
    run = hook.run_job("merge", local_location.uri, engine="spark", spark_conn_id="no_such_spark")
    assert run.returncode == 0 and run.reason is None
    assert run.summary["engine"] == "in_process" and run.summary["engine_requested"] == "spark"
    assert run.summary["engine_reason"] == "no executor work: no generation to merge"


def test_executor_work_on_a_missing_spark_connection_is_named(local_location):
    build_table(local_location, regions=1, generations=2)
    with pytest.raises(AirflowFailException, match="Spark connection 'no_such_spark' is not defined"):
        MemWalHook(memwal_conn_id=None).run_job("merge", local_location.uri, engine="spark",
                                               spark_conn_id="no_such_spark")
    assert not any(MemWalTable(local_location.uri).index.details.merged_generations.values()), "nothing merged"


def test_a_runners_error_is_not_worded_as_the_plans(local_location, monkeypatch):
    """An in-process job that fails: one task error naming the job and table, not '(planning)'."""
    import memwal.engines

    build_table(local_location, regions=1, generations=2)

    def boom(*args, **kwargs):
        raise OSError("disk gone")

    monkeypatch.setattr(memwal.engines, "in_process", boom)
    with pytest.raises(MemWalTaskError) as info:
        MemWalHook(memwal_conn_id=None).run_job("merge", local_location.uri, options=JobOptions())
    text = str(info.value)
    assert "disk gone" in text and "(planning)" not in text and text.startswith("memwal merge on table at")


def test_a_plan_error_is_worded_as_the_plans(local_location, monkeypatch):
    import memwal.engines

    build_table(local_location, regions=1, generations=2)

    def boom(*args, **kwargs):
        raise OSError("manifest unreadable")

    monkeypatch.setattr(memwal.engines, "plan_work", boom)
    with pytest.raises(MemWalTaskError, match=r"\(planning\): manifest unreadable"):
        MemWalHook(memwal_conn_id=None).run_job("merge", local_location.uri)
