"""Bad input and faults under the operators: an unknown table, a malformed or unknown region id, a table
without MemWAL, unreachable storage, a Spark master that is down, a missing connection. Each fails the
task with one line naming the thing and what to do, and the table is left exactly as it was. Exit status 3
(some regions failed) pushes the summary before failing the task."""

from __future__ import annotations

import json
import shutil
import socket

import lance
import pyarrow as pa
import pytest
from airflow.sdk.exceptions import AirflowFailException
from airflow_support import lance_core_table, merged_generations, run_dag, tables_file, task_states

from memwal import naming
from memwal.airflow.hooks.memwal import MemWalHook, MemWalTaskError
from memwal.airflow.operators.memwal import (
    MemWalCatchupOperator,
    MemWalGcOperator,
    MemWalMergeOperator,
    MemWalRetentionOperator,
    MemWalSnapshotOperator,
)
from memwal.region_manifest import load_latest_manifest

from support.tables import create_base, open_base


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def configure(tmp_path, monkeypatch):
    """Write a tables file with the given entries and point MEMWAL_TABLES_FILE at it."""

    def _configure(**tables: dict) -> None:
        monkeypatch.setenv("MEMWAL_TABLES_FILE", str(tables_file(tmp_path / "tables.yaml", tables)))

    return _configure


def state(location) -> tuple[int, dict]:
    """(table version, merged_generations): what must not change when a task is refused."""
    return open_base(location).version, merged_generations(location)


def one_line_error(excinfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text, f"one line: {text!r}"
    return text


class FakeTI:
    def __init__(self) -> None:
        self.pushed: dict[str, object] = {}

    def xcom_push(self, key: str, value: object) -> None:
        self.pushed[key] = value


def test_unknown_table_names_it_and_the_configured_ones(configure, local_location):
    configure(t1={"uri": local_location.uri, "engine": "in_process"})
    with pytest.raises(AirflowFailException) as exc:
        MemWalMergeOperator(task_id="m", table="orders").execute({})
    text = one_line_error(exc)
    assert "table 'orders'" in text and "t1" in text and "tables file" in text


def test_malformed_and_unknown_region_ids_are_refused_before_anything_runs(configure, local_location):
    a, _ = lance_core_table(local_location, regions=2, generations=2)
    configure(t1={"uri": local_location.uri, "engine": "in_process"})
    before = state(local_location)
    with pytest.raises(AirflowFailException) as exc:
        MemWalMergeOperator(task_id="m", table="t1", regions=[a, "region-7"]).execute({})
    assert "region id 'region-7' is not a UUID" in one_line_error(exc)
    unknown = "0b6e5f3c-1111-4222-8333-444455556666"
    with pytest.raises(AirflowFailException) as exc:
        MemWalGcOperator(task_id="g", table="t1", regions=[unknown]).execute({})
    text = one_line_error(exc)
    assert f"region {unknown}: no such region in table 't1'" in text and "memwal status" in text
    assert state(local_location) == before, "a refused task changes nothing"


def test_the_hook_checks_regions_as_memwal_does(local_location):
    """One region check (`memwal.jobs.check_regions`) behind the hook and `memwal` / `run_job`: the same
    verdict and words for each input (the hook used to accept an id with spaces the library refused)."""
    from memwal.errors import BadInputError
    from memwal.job_config import JobOptions
    from memwal.jobs import check_job_input
    from memwal.table import MemWalTable

    a, b = lance_core_table(local_location, regions=2, generations=1)
    unknown = "0b6e5f3c-1111-4222-8333-444455556666"
    hook, table = MemWalHook(memwal_conn_id=None), MemWalTable(local_location.uri)
    for regions, says in (([a.upper(), b], [a, b]), ([a, a], [a]), ([f" {a} "], [a]), (["region-7"], "is not a UUID"),
                          ([b, unknown], f"{unknown}: no such region in table")):
        try:
            check_job_input("merge", table, JobOptions(), regions)
            mine = None
        except BadInputError as exc:
            mine = str(exc)
        try:
            ids = hook.validate_regions(local_location.uri, regions)
            theirs = None
        except AirflowFailException as exc:
            theirs, ids = str(exc), None
        if isinstance(says, list):
            assert (mine, theirs, ids) == (None, None, says), regions
        else:
            assert says in mine and says in theirs, (regions, mine, theirs)
            first, second = (t.split(" (")[0].split(" in ")[0] for t in (mine.removeprefix("--region"),
                                                                          theirs.removeprefix("region")))
            assert first == second, (mine, theirs)



def test_a_table_without_memwal_is_named(configure, local_location):
    create_base(local_location)
    configure(t1={"uri": local_location.uri, "engine": "in_process"})
    before = open_base(local_location).version
    with pytest.raises(AirflowFailException) as exc:
        MemWalCatchupOperator(task_id="c", table="t1").execute({})
    text = one_line_error(exc)
    assert "table 't1'" in text and "has no MemWAL index" in text and "initialise MemWAL" in text
    assert open_base(local_location).version == before


def test_contradicting_primary_key_metadata_fails_the_merge_once_naming_the_columns(configure, local_location):
    """Two columns claim key position 1: the merge task fails with one line naming the table and both
    columns (not once per region, not retried), and nothing is merged."""
    pos = {"lance-schema:unenforced-primary-key:position": "1"}
    schema = pa.schema([pa.field("a", pa.int64(), nullable=False, metadata=pos),
                        pa.field("b", pa.int64(), nullable=False, metadata=pos)])
    lance.write_dataset(pa.table({"a": [1], "b": [2]}, schema=schema), local_location.uri)
    open_base(local_location).initialize_mem_wal(unsharded=True)
    configure(t1={"uri": local_location.uri, "engine": "in_process"})
    before = open_base(local_location).version
    with pytest.raises(AirflowFailException) as exc:
        MemWalMergeOperator(task_id="m", table="t1").execute({})
    text = one_line_error(exc)
    assert "table 't1'" in text and "columns 'a' and 'b' both have primary key position 1" in text, text
    assert open_base(local_location).version == before


def test_a_missing_table_is_named(configure, tmp_path):
    configure(t1={"uri": str(tmp_path / "nothing_here"), "engine": "in_process"})
    with pytest.raises(AirflowFailException) as exc:
        MemWalMergeOperator(task_id="m", table="t1").execute({})
    assert "does not exist" in one_line_error(exc) and "uri in the tables file" in str(exc.value)
    assert not (tmp_path / "nothing_here").exists(), "opening a missing table creates nothing"


def test_unreachable_storage_names_the_endpoint_and_the_connection(configure, monkeypatch):
    port = closed_port()
    conn = {"conn_type": "memwal", "host": f"http://127.0.0.1:{port}", "login": "AKIDTEST",
            "password": "not-a-real-secret-1234", "extra": {"region": "us-east-1", "allow_http": True}}
    monkeypatch.setenv("AIRFLOW_CONN_LAKE", json.dumps(conn))
    configure(t1={"uri": "s3://bucket/table", "conn_id": "lake", "engine": "in_process"})
    with pytest.raises(MemWalTaskError) as exc:
        MemWalMergeOperator(task_id="m", table="t1").execute({})
    text = one_line_error(exc)
    assert f"storage unreachable (http://127.0.0.1:{port})" in text and "connection 'lake'" in text
    assert "not-a-real-secret-1234" not in text


def test_a_missing_connection_is_named(configure, local_location):
    configure(t1={"uri": local_location.uri, "conn_id": "nope_conn", "engine": "in_process"})
    with pytest.raises(AirflowFailException) as exc:
        MemWalMergeOperator(task_id="m", table="t1").execute({})
    assert "connection 'nope_conn'" in one_line_error(exc) and "create it" in str(exc.value)


def test_a_spark_master_that_is_down_fails_fast_and_submits_nothing(configure, local_location, monkeypatch):
    lance_core_table(local_location, regions=1, generations=2)
    port = closed_port()
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DOWN", json.dumps(
        {"conn_type": "spark", "host": "spark://127.0.0.1", "port": port}))
    configure(t1={"uri": local_location.uri, "engine": "spark", "spark_conn_id": "spark_down"})
    before = state(local_location)
    with pytest.raises(MemWalTaskError) as exc:
        MemWalMergeOperator(task_id="m", table="t1").execute({})
    text = one_line_error(exc)
    assert f"Spark master spark://127.0.0.1:{port}" in text and "'spark_down'" in text and "start it" in text
    assert state(local_location) == before


def test_a_missing_spark_connection_is_named(configure, local_location):
    lance_core_table(local_location, regions=1, generations=1)
    configure(t1={"uri": local_location.uri, "engine": "spark", "spark_conn_id": "no_spark_here"})
    with pytest.raises(AirflowFailException) as exc:
        MemWalMergeOperator(task_id="m", table="t1").execute({})
    assert "Spark connection 'no_spark_here' is not defined" in one_line_error(exc)


def test_some_regions_failed_pushes_the_summary_then_fails(configure, local_location):
    """Region B's generation 1 directory is gone: region A merges, B is reported; exit status 3 semantics:
    the summary is pushed to XCom, then the task fails naming the region."""
    a, b = lance_core_table(local_location, regions=2, generations=2)
    gen = load_latest_manifest(local_location.store(), b).flushed_generations[0]
    shutil.rmtree(f"{local_location.uri}/{naming.generation_dir(b, gen.path)}")
    configure(t1={"uri": local_location.uri, "engine": "in_process"})
    ti = FakeTI()
    with pytest.raises(MemWalTaskError) as exc:
        MemWalMergeOperator(task_id="m", table="t1", outlets=[]).execute({"ti": ti})
    text = one_line_error(exc)
    assert "1 of 2 region(s) failed" in text and b in text
    summary = ti.pushed["return_value"]
    assert summary["failed_regions"] == [b]
    assert merged_generations(local_location) == {a: 2}, "the healthy region is merged"


def test_storage_options_come_from_the_connection_fields():
    from airflow.sdk import Connection

    conn = Connection(conn_id="c", conn_type="memwal", host="minio.local", port=9000, login="AK",
                      password="SECRETSECRET", extra=json.dumps({
                          "region": "eu-west-1", "allow_http": True,
                          "storage_options": {"virtual_hosted_style_request": False}}))
    assert MemWalHook.storage_options_from(conn) == {
        "aws_endpoint": "https://minio.local:9000", "aws_access_key_id": "AK",
        "aws_secret_access_key": "SECRETSECRET", "aws_region": "eu-west-1", "allow_http": "true",
        "virtual_hosted_style_request": "false",
    }


def test_unknown_region_under_airflow_fails_the_plan_task_and_merges_nothing(airflow_home, local_location, tmp_path):
    """Through dag.test(): memwal_merge with a region id that does not exist fails at `plan` with the one
    line, the merge task never runs, and the table is unchanged."""
    lance_core_table(local_location, regions=1, generations=2)
    before = state(local_location)
    unknown = "0b6e5f3c-1111-4222-8333-444455556666"
    env = {"MEMWAL_TABLES_FILE": str(tables_file(tmp_path / "tables.yaml",
                                                 {"t1": {"uri": local_location.uri, "engine": "in_process"}}))}
    report = run_dag(airflow_home, "memwal_merge", {"table": "t1", "regions": [unknown]}, extra_env=env)
    assert report["state"] == "failed"
    states = task_states(report)
    assert states[("plan", -1)] == "failed" and states[("merge", -1)] in ("upstream_failed", "None")
    assert f"region {unknown}: no such region in table 't1'" in report["log"]
    assert state(local_location) == before
    assert lance.dataset(local_location.uri).version == before[0]


@pytest.mark.parametrize(("operator", "setting", "key"), [
    (MemWalGcOperator, "gc: {grace_period_s: .nan}", "gc.grace_period_s"),
    (MemWalRetentionOperator, "retention: {older_than_s: .inf}", "retention.older_than_s"),
    (MemWalRetentionOperator, "retention: {older_than_s: 1.0e+11}", "retention.older_than_s"),
    (MemWalSnapshotOperator, "snapshot_inline_threshold: -5", "snapshot_inline_threshold"),
])
def test_a_setting_the_command_line_refuses_fails_the_task_without_retry(tmp_path, monkeypatch, local_location,
                                                                        operator, setting, key):
    """A NaN grace period used to disable failed-flush cleanup silently, an infinite retention age to end in
    an OverflowError retried as if transient: the tables file refuses them, naming the table and the key."""
    lance_core_table(local_location, regions=1, generations=1)
    path = tmp_path / "tables.yaml"
    path.write_text(f"tables:\n  t1: {{uri: {local_location.uri}, engine: in_process, {setting}}}\n")
    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(path))
    before = state(local_location)
    with pytest.raises(AirflowFailException) as exc:
        operator(task_id="x", table="t1").execute({})
    assert f"table 't1', key '{key}'" in one_line_error(exc)
    assert state(local_location) == before


def test_an_unknown_index_fails_catchup_without_retry_and_commits_nothing(configure, local_location):
    """Catch-up of an index the table does not have used to report it optimised, with a commit."""
    lance_core_table(local_location, regions=1, generations=1)
    configure(t1={"uri": local_location.uri, "engine": "in_process"})
    before = state(local_location)
    with pytest.raises(AirflowFailException) as exc:
        MemWalCatchupOperator(task_id="c", table="t1", indexes=["nosuch"]).execute({})
    text = one_line_error(exc)
    assert "table 't1'" in text and "--index 'nosuch': no such index" in text and "name_idx" in text, text
    assert state(local_location) == before
