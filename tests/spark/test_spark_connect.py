"""The spark_connect engine against a real Spark Connect server (one per session, `connect_server`): every job
with its executor work on the server gives what the same job gives in process; the storage secret reaches
the executors but no server log or event log; the Airflow operator reaches the server through a
`spark_connect` connection; a server that is down is one line naming the connection and the URL, and the
retry resumes."""

from __future__ import annotations

import hashlib
import json
import socket
import uuid
from pathlib import Path

import lance
import pytest
from spark_helpers import Loc, base_rows, build_table, lsm_view

from memwal.mem_wal_index import load_index
from memwal.table import MemWalTable
from spark_jobs.connect import open_session, run_job_on_connect, run_on_session
from spark_jobs.task_runner import spark_runner

pytestmark = pytest.mark.spark

JOBS = ("merge", "catchup", "snapshot", "compaction", "gc", "retention")


def _options(job: str):
    from memwal.job_config import GcConfig, JobOptions
    from memwal.maintenance_config import CompactionConfig, RetentionConfig

    return {
        "compaction": JobOptions(compaction=CompactionConfig(force=True, target_rows_per_fragment=1000)),
        "gc": JobOptions(gc=GcConfig(keep_manifest_versions=1, grace_period_s=0)),
        "retention": JobOptions(retention=RetentionConfig(older_than_s=0, keep_versions=1)),
    }.get(job, JobOptions())


def _table(loc) -> MemWalTable:
    build_table(loc)
    lance.dataset(loc.uri, storage_options=loc.storage_options).create_scalar_index("name", "BTREE", name="name_idx")
    return MemWalTable(loc.uri, loc.storage_options)


def _comparable(job: str, s: dict) -> dict:
    """What a job's summary says about the table, not about where or how fast it ran."""
    if job == "merge":
        return {"generations_merged": s["generations_merged"], "failed": s["failed_regions"]}
    if job == "catchup":
        return {i["index_name"]: (i["covered"], i["error"]) for i in s["indexes"]}
    if job == "snapshot":
        return {k: s[k] for k in ("num_regions", "storage", "regions_skipped", "commits")}
    if job == "compaction":
        return {"after": s["health_after"]["fragments"], "error": s.get("error")}
    if job == "retention":
        return {"ranges": len(s["retained_ranges"])}
    return {"failed": s.get("failed_regions")}


def _read_logs(root: Path) -> str:
    """The server's log and its event log (plain or zstd), as text."""
    import zstandard

    text = []
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        data = p.read_bytes()
        if ".zst" in p.name:
            data = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read()
        text.append(data.decode(errors="replace"))
    return "\n".join(text)


def test_every_job_on_spark_connect_equals_in_process(connect_server, tmp_path, s3_location):
    """Table A (local) runs each job in process; table B (S3, its secret key a canary) runs the same jobs with
    the executor work on the Connect server. Rule: after each job the base table and the LSM view of B equal
    A's, the summaries agree on what they did, the merge deduplicated on the server; the canary reached the
    executors (control) and is in no server log or event log line (whose plan text the search does find)."""
    canary = f"canary-{uuid.uuid4().hex}"
    a = Loc(str(tmp_path / "a"))
    b = Loc(s3_location.uri, {**s3_location.storage_options, "aws_secret_access_key": canary}, "s3")
    ta, tb = _table(a), _table(b)
    from memwal.jobs import run_job

    for job in JOBS:
        want = run_job(job, ta, _options(job))
        got = run_job_on_connect(job, connect_server.url, tb, _options(job))
        assert got["spark_connect_url"] == connect_server.url and got["job"] == job
        assert _comparable(job, got) == _comparable(job, want), (job, got, want)
        assert base_rows(b) == base_rows(a), f"after {job} the base tables agree"
        assert lsm_view(b) == lsm_view(a), f"after {job} the LSM views agree"
        if job == "merge":
            assert got["spark_dedup"]["jobs"] >= 1, "the merge deduplicated on the Connect server"
        if job == "compaction":
            assert got["tasks_committed"] >= 1 and got["health_after"]["fragments"] == 1
    assert dict(load_index(b.uri, b.storage_options).merged_generations).values()

    # Control: the storage options travel pickled with the tasks, as with spark-submit (the executors need them).
    def secret_hash(t: MemWalTable) -> str:
        import hashlib

        return hashlib.sha256(t.storage_options["aws_secret_access_key"].encode()).hexdigest()

    with open_session(connect_server.url) as spark:
        assert spark_runner(spark)(secret_hash, [tb]) == [hashlib.sha256(canary.encode()).hexdigest()]
    logs = _read_logs(connect_server.root)
    assert "map_partitions" in logs and "python_udf" in logs, "control: the event log's plan text is searched"
    assert "[truncated(size=" in logs, "the server logs a UDF's bytes only as a truncated prefix"
    assert canary not in logs, "the storage secret must not reach the Connect server's logs or event log"


def test_a_session_ships_our_code_as_an_artifact(connect_server):
    """The executors import memwal from the session's artifact (the verified zip), not from a path of ours."""
    def where(_):
        import memwal

        return memwal.__file__

    with open_session(connect_server.url) as spark:
        (path,) = spark_runner(spark)(where, [0])
    assert ".zip" in path and "memwal-code-" in path, path


class _Events:
    """The task context's outlet_events, recording what the merge operator adds."""

    def __init__(self) -> None:
        self.added: list = []

    def __getitem__(self, outlet):
        return self

    def add(self, asset, extra=None) -> None:
        self.added.append((asset, extra))


def test_merge_through_the_operator_on_a_spark_connect_connection(connect_server, tmp_path, monkeypatch):
    """engine: spark_connect in the tables file, a `spark_connect` connection (host, port) as the provider
    defines it: the merge's dedup ran on the server, its driver in this process; the base table equals the
    LSM view; the summary says where each part ran and why. A second run finds nothing and starts nothing."""
    from memwal.airflow.operators.memwal import MemWalMergeOperator

    loc = Loc(str(tmp_path / "t"))
    build_table(loc)
    expected = lsm_view(loc)
    port = int(connect_server.url.rsplit(":", 1)[1])
    monkeypatch.setenv("AIRFLOW_CONN_SC_TEST", json.dumps({"conn_type": "spark_connect", "host": "127.0.0.1",
                                                           "port": port}))
    tables = tmp_path / "tables.yaml"
    tables.write_text(json.dumps({"tables": {"t1": {"uri": loc.uri, "engine": "spark_connect",
                                                    "spark_connect_conn_id": "sc_test"}}}))
    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(tables))
    summary = MemWalMergeOperator(task_id="m", table="t1").execute({"outlet_events": _Events()})
    assert summary["ran_on"] == {"plan": "in_process", "driver": "in_process", "dedup": "spark_connect"}
    assert summary["engine"] == "spark_connect" and summary["spark_connect_url"].startswith("sc://127.0.0.1:")
    assert summary["spark_dedup"]["jobs"] >= 1 and base_rows(loc) == expected
    again = MemWalMergeOperator(task_id="m", table="t1").execute({"outlet_events": _Events()})
    assert again["engine"] == "in_process" and again["engine_reason"] == "no executor work: no generation to merge"


def test_a_connect_server_that_is_down_is_one_line_and_the_retry_resumes(connect_server, tmp_path, monkeypatch):
    """The connection points at a port where no server listens: the task fails (to be retried) with one line
    naming the connection and the URL, its token redacted; nothing merged. Pointed at the live server, the
    retry merges everything."""
    from memwal.airflow.hooks.memwal import MemWalTaskError
    from memwal.airflow.operators.memwal import MemWalMergeOperator

    loc = Loc(str(tmp_path / "t"))
    build_table(loc)
    expected = lsm_view(loc)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    token = f"tok-{uuid.uuid4().hex}"
    monkeypatch.setenv("AIRFLOW_CONN_SC_DOWN", json.dumps({"conn_type": "spark_connect", "host": "127.0.0.1",
                                                           "port": dead, "password": token}))
    tables = tmp_path / "tables.yaml"
    tables.write_text(json.dumps({"tables": {"t1": {"uri": loc.uri, "engine": "spark_connect",
                                                    "spark_connect_conn_id": "sc_down"}}}))
    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(tables))
    with pytest.raises(MemWalTaskError) as exc:
        MemWalMergeOperator(task_id="m", table="t1").execute({})
    text = str(exc.value)
    assert "\n" not in text and "'sc_down'" in text and f"sc://127.0.0.1:{dead}" in text and "not reachable" in text
    assert token not in text and "token=***" in text
    assert not any(load_index(loc.uri).merged_generations.values()), "nothing merged"
    port = int(connect_server.url.rsplit(":", 1)[1])
    monkeypatch.setenv("AIRFLOW_CONN_SC_DOWN", json.dumps({"conn_type": "spark_connect", "host": "127.0.0.1",
                                                           "port": port}))
    summary = MemWalMergeOperator(task_id="m", table="t1").execute({"outlet_events": _Events()})
    assert summary["engine"] == "spark_connect" and base_rows(loc) == expected


def test_run_on_session_works_on_a_classic_session_too(spark, tmp_path):
    """The same entry (`run_on_session`) drives a classic session (the snapshot reads manifests through it),
    also after Connect sessions in this process: they leave no Connect marker behind."""
    import os

    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ
    loc = Loc(str(tmp_path / "t"))
    build_table(loc)
    summary = run_on_session("snapshot", spark, MemWalTable(loc.uri), _options("snapshot"))
    assert summary["job"] == "snapshot"


def test_tasks_share_one_session_and_its_python_workers(connect_server):
    """Two tasks (two sessions opened one after the other, as two Airflow tasks do) attach to the same
    server-side session: the second finds the executors' Python workers the first started (same pids), so
    it pays no worker start-up and no imports."""
    import os

    def pid(_):
        import os

        return os.getpid()

    seen = []
    for _ in range(2):
        with open_session(connect_server.url) as spark:
            seen.append(set(spark_runner(spark)(pid, [0, 1])))
    assert seen[0] & seen[1], f"the second task reused the first one's Python workers: {seen}"
    assert os.getpid() not in seen[0]
