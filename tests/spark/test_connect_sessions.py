"""spark_jobs.connect's client per process (issue 44, fixed costs): the jobs of one process share one Connect
client (one channel, one code upload); a job's own error leaves it in use; a lost client or server is
replaced by a new one; at exit the client is closed and the interpreter skips its final full collection; a
job the plan keeps in the task imports no Spark client at all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from spark_helpers import Loc, base_rows, build_table, lsm_view

from memwal.job_config import JobOptions
from memwal.table import MemWalTable
from spark_jobs import connect
from spark_jobs.task_runner import spark_runner

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def builds(monkeypatch):
    """No client kept from earlier tests; the sessions built (connect._session calls) are recorded, and the
    clients this test kept are closed after it (the shared server-side session stays)."""
    monkeypatch.setattr(connect, "_clients", {}, raising=False)
    built: list = []
    real = connect._session

    def spy(*args, **kwargs):
        built.append(real(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(connect, "_session", spy)
    yield built
    for spark in built:
        spark.release_session_on_close = False
        spark.stop()


def _one(spark) -> int:
    return spark_runner(spark)(abs, [-1])[0]


def test_two_jobs_in_one_process_share_one_client(connect_server, tmp_path, builds):
    """Two merges in one process (as a task running several jobs, or a fleet batch): one session built, the
    second job's attach is free; each merge gives the LSM view it had."""
    tables = [Loc(str(tmp_path / name)) for name in ("a", "b")]
    for loc in tables:
        build_table(loc)
    want = [lsm_view(loc) for loc in tables]
    summaries = [connect.run_job_on_connect("merge", connect_server.url, MemWalTable(loc.uri), JobOptions())
                 for loc in tables]
    assert len(builds) == 1, f"one Connect session built for two jobs, not {len(builds)}"
    assert all(s["spark_dedup"]["jobs"] >= 1 for s in summaries), "both merges deduplicated on the server"
    assert [base_rows(loc) for loc in tables] == want
    with connect.open_session(connect_server.url) as a, connect.open_session(connect_server.url) as b:
        assert a is b is builds[0]


def test_a_job_error_leaves_the_client_in_use(connect_server, builds):
    """A task that raises fails its job; the next job runs on the same client."""
    def boom(_):
        raise ValueError("the job's own error")

    with pytest.raises(Exception, match="the job's own error"), connect.open_session(connect_server.url) as spark:
        spark_runner(spark)(boom, [0])
    with connect.open_session(connect_server.url) as again:
        assert _one(again) == 1
    assert len(builds) == 1 and again is builds[0] and not again.is_stopped


def test_a_lost_client_is_replaced(connect_server, builds):
    """The server went away during a job (ConnectServerError): that client is discarded and closed, the next
    job builds a new one. A client closed under us (is_stopped) is replaced as well."""
    with pytest.raises(connect.ConnectServerError), connect.open_session(connect_server.url):
        raise connect.ConnectServerError("Spark Connect at sc://x failed during memwal merge: gone")
    assert len(builds) == 1 and builds[0].is_stopped, "the lost client is closed"
    with connect.open_session(connect_server.url) as second:
        assert _one(second) == 1
    assert len(builds) == 2 and second is builds[1]
    second.release_session_on_close = False
    second.stop()
    with connect.open_session(connect_server.url) as third:
        assert _one(third) == 1
    assert len(builds) == 3 and third is builds[2]


def test_at_exit_the_client_is_closed_and_the_heap_frozen(connect_server):
    """A process that ran a job on Connect: at exit (after its own atexit handlers registered later) the kept
    client is closed, the shared session left open, and gc.freeze spared the final full collection."""
    script = f"""
import atexit, gc, sys
from spark_jobs import connect
seen = {{}}
atexit.register(lambda: print("frozen", gc.get_freeze_count() > 0, "closed", seen["s"].is_stopped,
                              "release", seen["s"].release_session_on_close))
with connect.open_session({connect_server.url!r}) as spark:
    seen["s"] = spark
    assert spark_runner(spark)(abs, [-1]) == [1]
"""
    script = "from spark_jobs.task_runner import spark_runner\n" + script
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), str(REPO)])}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "frozen True closed True release False", proc.stdout


def test_a_job_without_executor_work_imports_no_spark_client(tmp_path):
    """`memwal gc TABLE --spark-connect URL`: the plan sends GC to the task itself, and the process never
    imports pyspark or grpc (their import is most of a Connect job's fixed cost); no server is needed."""
    loc = Loc(str(tmp_path / "t"))
    build_table(loc)
    script = f"""
import sys
from memwal.cli import main
assert main(["gc", {loc.uri!r}, "--spark-connect", "sc://127.0.0.1:1", "--json"]) == 0
print("loaded", sorted(m for m in ("pyspark", "grpc") if m in sys.modules))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), str(REPO)])}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "loaded []", proc.stdout[-500:]
    assert '"engine": "in_process"' in proc.stdout


def test_at_exit_pyspark_makes_no_round_trip_for_a_kept_client(connect_server):
    """pyspark's own exit handler of a client still open cleans the server's ML cache (a round trip, retried
    for seconds when the server is gone). A process that replaced a lost client: both clients are closed
    before pyspark's handlers run, which then make no round trip."""
    script = f"""
import atexit
from pyspark.sql.connect.client import core
from spark_jobs import connect
from spark_jobs.task_runner import spark_runner
calls = []
core.SparkConnectClient._cleanup_ml_cache = lambda self: calls.append(self)
atexit.register(lambda: print("cleanups", len(calls)))
try:
    with connect.open_session({connect_server.url!r}):
        raise connect.ConnectServerError("gone")
except connect.ConnectServerError:
    pass
with connect.open_session({connect_server.url!r}) as spark:
    assert spark_runner(spark)(abs, [-1]) == [1]
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), str(REPO)])}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "cleanups 0", proc.stdout


def test_the_client_is_imported_and_a_job_module_loaded_with_no_collection(connect_server, tmp_path):
    """pyspark's Connect client (some 250 modules) and the job's entry point are imported with the cyclic
    collector off (an import makes objects, not garbage): no collection until every module is in, and the
    collector is back on for the job."""
    loc = Loc(str(tmp_path / "t"))
    build_table(loc)
    script = f"""
import gc, importlib, sys, types
from memwal.job_config import JobOptions
from memwal.table import MemWalTable
from spark_jobs import connect
starts, during = [], []
gc.callbacks.append(lambda phase, info: starts.append(len(sys.modules)) if phase == "start" else None)
connect.import_client()
loaded = "pyspark.sql.connect.session" in sys.modules
collections = sum(n < len(sys.modules) for n in starts)  # those while modules were still being imported
connect.importlib = types.SimpleNamespace(
    import_module=lambda name: (during.append(gc.isenabled()), importlib.import_module(name))[1])
summary = connect.run_job_on_connect("gc", {connect_server.url!r}, MemWalTable({loc.uri!r}), JobOptions())
print(loaded, collections, during, gc.isenabled(), summary["job"])
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), str(REPO)])}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "True 0 [False] True gc", proc.stdout[-500:]
