"""Spark fixtures: one local[2] SparkSession for the in-process tests, and a standalone cluster (a master
and one worker from the pyspark distribution on 127.0.0.1) for spark-submit --master spark://..."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from ports import free_port  # scripts/ (tests/conftest.py)

from spark_jobs import common, submit

from support.jvm import FAST_JVM, FAST_JVM_OPTIONS

# Workers must run this interpreter (the venv), not whatever python3 is on PATH.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark():
    session, created = common.build_spark("tests", master="local[2]", conf=FAST_JVM)
    yield session
    if created:
        session.stop()


@pytest.fixture(scope="session")
def standalone_master(tmp_path_factory):
    """spark://127.0.0.1:PORT of a master with one ALIVE worker (1 core, 1g); both killed at teardown."""
    home = submit.spark_home()
    spark_class = str(Path(home) / "bin" / "spark-class")
    logs = tmp_path_factory.mktemp("standalone")
    port, ui, worker_ui = free_port(), free_port(), free_port()
    env = {**os.environ, "SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1",
           "SPARK_DAEMON_JAVA_OPTS": FAST_JVM_OPTIONS}
    procs = []
    log_files = []

    def start(name: str, args: list[str]) -> None:
        out = open(logs / f"{name}.log", "w")  # noqa: SIM115 - closed at teardown
        log_files.append(out)
        procs.append(subprocess.Popen([spark_class, *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                                      stdin=subprocess.DEVNULL, cwd=logs))

    try:
        start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                         "--webui-port", str(ui)])
        url = f"spark://127.0.0.1:{port}"
        start("worker", ["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "1",
                         "--memory", "1g", "--webui-port", str(worker_ui), "--work-dir", str(logs / "work")])
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as resp:
                    state = json.load(resp)
                if any(w.get("state") == "ALIVE" for w in state.get("workers", [])):
                    break
            except (OSError, ValueError):
                pass
            dead = [p for p in procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                tails = {f.name: Path(f.name).read_text()[-2000:] for f in log_files}
                raise RuntimeError(f"standalone cluster did not come up: {tails}")
            time.sleep(0.2)
        yield url
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in log_files:
            f.close()


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory):
    """One local Spark Connect server (local[2]) for the session, with its event log on: the Connect tests
    share it, as Airflow tasks share a deployment's server (each job opens its own session)."""
    from spark_jobs.connect_server import ConnectServer

    root = tmp_path_factory.mktemp("spark-connect")
    (root / "events").mkdir()
    server = ConnectServer(master="local[2]", event_log_dir=f"file://{root / 'events'}", log_path=root / "server.log",
                           conf={**FAST_JVM, "spark.eventLog.compress": "false"})
    server.start()
    server.root = root
    yield server
    server.close()
