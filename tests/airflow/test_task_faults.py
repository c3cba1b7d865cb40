"""The Airflow merge task against a misbehaving S3 (issue 42): the table's `memwal` connection names the fault
proxy (tests/support/fault_proxy.py), so every request of the task (ours and Lance's) goes through it. A
store that starts failing after the merge's first Lance commit and keeps failing fails the attempt with one
line naming the table, the operation, the object and the fault, as an error Airflow retries; the retry,
once the store answers again, merges everything once, and no table version ever read other than exact."""

from __future__ import annotations

import json
import re
import shutil
import uuid
from pathlib import Path

import pytest
from airflow_support import merged_generations, run_dag, tables_file, task_states

from memwal.reader import LsmReader
from memwal.table import MemWalTable

from support.fault_proxy import FaultProxy
from support.maintenance import write_generations
from support.merge_passes import exact_everywhere
from support.tables import create_base, open_base, view

HERE = Path(__file__).resolve().parent
GENS = [([20, 21, 5], "g1", [3, 4]), ([3, 7], "g2", [20])]  # one commit each: the store fails after the first


def _connection(proxy: FaultProxy) -> str:
    """A `memwal` connection to the proxy; one client retry so a store that keeps failing fails in seconds."""
    return json.dumps({"conn_type": "memwal", "host": proxy.endpoint, "login": "testing", "password": "testing",
                       "extra": {"region": "us-east-1", "allow_http": True, "storage_options": {
                           "client_max_retries": "1", "client_retry_timeout": "10"}}})


def test_a_store_that_keeps_failing_fails_the_task_once_retryably_and_the_retry_merges_exactly(
        airflow_home, s3_endpoint, s3_location, tmp_path):
    """Under dag.test(), the real merge operator (one generation per commit, one client retry) with one
    immediate retry: the store fails everything for the table from the merge's first Lance commit on, until
    Airflow has put the task up for retry (its on_retry_callback). Before issue 42's fix the attempt's error
    was Lance's, from the merge's closing read of the table version, and the region's own error and the
    summary were lost."""
    loc = s3_location
    create_base(loc, ids=range(10))
    open_base(loc).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    write_generations(loc, region, GENS)
    model = view(LsmReader(MemWalTable(loc.uri, loc.storage_options)).scan())
    v0 = open_base(loc).version
    dags, faults = tmp_path / "dags", tmp_path / "faults"
    dags.mkdir()
    faults.mkdir()
    shutil.copy(HERE / "faulty_store_dags.py", dags / "memwal_faulty_store_merge.py")
    env = {"AIRFLOW__CORE__DAGS_FOLDER": str(dags), "MEMWAL_TEST_FAULT_DIR": str(faults),
           "MEMWAL_TABLES_FILE": str(tables_file(tmp_path / "tables.yaml", {"t1": {
               "uri": loc.uri, "conn_id": "lake_faulty", "engine": "in_process", "schedule": None,
               "max_generations_per_commit": 1}}))}
    retried = faults / "retried"
    with FaultProxy(s3_endpoint) as proxy:
        # The merge's first Lance commit lands (a harmless stall marks it); from then on every request for the
        # table answers 503 SlowDown until Airflow has decided to retry the task.
        proxy.plan("stall", method="PUT", key=r"^table/_versions/", action=lambda: proxy.plan(
            "503", key=r"^table/", times=10**9, until=retried.exists))
        env["AIRFLOW_CONN_LAKE_FAULTY"] = _connection(proxy)
        report = run_dag(airflow_home, "memwal_faulty_store_merge", extra_env=env)
    assert retried.exists(), f"Airflow did not retry the task:\n{report['log'][-3000:]}"  # AirflowFailException?
    kind, error = retried.read_text().split("\n", 1)
    assert kind == "memwal.airflow.hooks.memwal.MemWalTaskError" and "\n" not in error, (kind, error)
    # The attempt's error is the merge's own (its region failed; exit 3, the summary pushed to XCom), not
    # that of a later read of the same failing store.
    assert error.startswith(f"memwal merge on table 't1' ({loc.uri}): 1 of 1 region(s) failed: {region}: "), error
    assert "503 Service Unavailable" in error and "SlowDown" in error and "after 1 retries" in error, error
    named = (rf"object store (get|head|list|put|delete) of \S+ in table {re.escape(loc.uri)} failed: "  # ours
             r"|Error performing (GET|HEAD|PUT|POST|DELETE) http://\S+/table/")  # Lance's: the URL names the key
    assert re.search(named, error), f"the operation and the object: {error}"
    assert report["state"] == "success" and task_states(report)[("merge", -1)] == "success", report["log"][-3000:]
    assert merged_generations(loc) == {region: 2}
    exact_everywhere(loc, v0, model)


def test_the_maintenance_dags_retry_their_tasks():
    """A store fault is an error Airflow retries (MemWalTaskError, an AirflowException) only if the task has
    retries: the maintenance, merge and backfill DAGs give theirs."""
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from memwal.airflow.dag_factory import DEFAULT_ARGS
    from memwal.airflow.hooks.memwal import MemWalTaskError

    assert DEFAULT_ARGS["retries"] >= 1 and DEFAULT_ARGS["retry_delay"].total_seconds() > 0
    assert issubclass(MemWalTaskError, AirflowException) and not issubclass(MemWalTaskError, AirflowFailException)


def test_a_store_failing_from_the_start_fails_the_operator_with_one_retryable_line(s3_endpoint, s3_location, tmp_path,
                                                                                   monkeypatch):
    """Every request for the table answers 503 from the start: opening the table fails (Lance's listing of
    `_versions/`), the task error is one line naming the table, the operation, the object and the fault, and
    it is an error Airflow retries; nothing is written."""
    from airflow.sdk.exceptions import AirflowFailException

    from memwal.airflow.hooks.memwal import MemWalTaskError
    from memwal.airflow.operators.memwal import MemWalMergeOperator

    loc = s3_location
    create_base(loc, ids=range(10))
    open_base(loc).initialize_mem_wal(unsharded=True)
    write_generations(loc, str(uuid.uuid4()), GENS[:1])
    v0 = open_base(loc).version
    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(tables_file(tmp_path / "tables.yaml", {"t1": {
        "uri": loc.uri, "conn_id": "lake_down", "engine": "in_process"}})))
    with FaultProxy(s3_endpoint) as proxy:
        proxy.plan("503", key=r"^table/", times=10**9)
        monkeypatch.setenv("AIRFLOW_CONN_LAKE_DOWN", _connection(proxy))
        with pytest.raises(MemWalTaskError) as caught:
            MemWalMergeOperator(task_id="m", table="t1").execute({})
    error = str(caught.value)
    assert not isinstance(caught.value, AirflowFailException) and "\n" not in error, error
    assert error.startswith(f"table 't1' ({loc.uri}): "), error
    assert re.search(r"Error performing list request: Error performing GET http://\S+\?list-type=2&prefix="
                     r"table%2F_versions%2F", error), error
    assert "503 Service Unavailable" in error and "SlowDown" in error, error
    assert {m for m, _, _ in proxy.log} <= {"GET", "HEAD", "LIST"} and open_base(loc).version == v0
