"""Shared fixtures: table locations on the local filesystem and on a real S3-compatible endpoint
(moto_server on 127.0.0.1, started once per test session as a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from memwal.storage import ObjectStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from support.s3_decoy import isolate_environment

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from ports import free_port  # noqa: E402  (re-exported for the tests)


@dataclass(frozen=True)
class Location:
    """Where a test table lives: its URI and the storage options Lance and obstore take."""

    kind: str
    uri: str
    storage_options: dict[str, str] | None

    def store(self) -> ObjectStore:
        return ObjectStore(self.uri, self.storage_options)

    def child(self, name: str) -> Location:
        return Location(self.kind, f"{self.uri.rstrip('/')}/{name}", self.storage_options)


# S3 tests see S3 only through what the code under test passes: from here on, this process and every child
# (Airflow, spark-submit, Spark workers, the CLI) have an environment whose S3 is a refusing decoy.
isolate_environment()


@pytest.fixture(scope="session")
def s3_endpoint():
    """A moto S3 server on 127.0.0.1 for this test session; yields its endpoint URL. Nothing reaches it
    unless the code under test passes this endpoint (see the decoy above)."""
    port = free_port()
    moto = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen(
        [str(moto), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("moto_server did not start") from None
            time.sleep(0.1)
    yield endpoint
    proc.terminate()
    proc.wait(timeout=10)


def s3_options(endpoint: str) -> dict[str, str]:
    return {
        "aws_endpoint": endpoint,
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "aws_region": "us-east-1",
        "allow_http": "true",
    }


def new_bucket(endpoint: str) -> str:
    import boto3

    name = f"memwal-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket=name)
    return name


@pytest.fixture
def local_location(tmp_path) -> Location:
    return Location("local", str(tmp_path / "table"), None)


@pytest.fixture
def s3_location(s3_endpoint) -> Location:
    return Location("s3", f"s3://{new_bucket(s3_endpoint)}/table", s3_options(s3_endpoint))


@pytest.fixture(params=["local", "s3"])
def location(request) -> Location:
    """Runs the test once on the local filesystem and once on S3 (moto)."""
    if request.param == "local":
        return request.getfixturevalue("local_location")
    return request.getfixturevalue("s3_location")


# A crashed job (the crash tests SIGKILL children inside commits) holds the MemWAL index lock for one
# lease; keep that short in tests. Children inherit it.
os.environ.setdefault("MEMWAL_LOCK_LEASE_S", "4")


@pytest.fixture(autouse=True, scope="session")
def _spark_python():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


# --- Tiers and cores (issue 34). `make test-fast` deselects the slow tiers by marker; `make test` runs on two
# cores with pytest-xdist (--dist loadgroup): tests that share a server or a per-session resource carry an
# xdist_group, so each group runs serially on one worker while independent tests spread over both.
# Marked by directory here (one place, so a new file in a tier's directory is in its tier).
_TIER_MARKS = {
    "spark": ("spark",),  # a SparkSession, a standalone cluster or spark-submit: JVMs, tens of seconds each
    "e2e": ("slow", "server"),  # a real Airflow (PostgreSQL on 127.0.0.1:5432 when it answers) + Spark + moto
    "deploy": ("slow", "server"),  # builds and installs the wheel into fresh environments, then runs Spark
    "model": ("model",),  # hypothesis state machines: the longest single tests of the suite
    "airflow": ("airflow",),  # DAG runs in child Airflow processes on one migrated Airflow home per session
    "crash": ("slow",),  # each case a child process killed at a fault point
    "concurrency": ("slow",),  # child processes racing on one table
}
# One worker each: the Spark tests share a session's SparkSession, standalone cluster and Connect server
# (tests/spark/conftest.py); the real-Airflow tests start Airflow's servers and their PostgreSQL databases;
# the DAG tests share one migrated Airflow home (tests/airflow/conftest.py). Starting these twice would cost
# more than it saves and put two JVM clusters on two cores.
_GROUPS = {"spark": "spark", "e2e": "server", "deploy": "server", "airflow": "airflow"}
# Only the Spark tests on those session fixtures share a worker; the ones that start their own spark-submit
# (the CLI, the submit and security tests) spread over both workers.
_SPARK_SESSION_FIXTURES = {"spark", "standalone_master", "connect_server"}
# The longest single tests start first (xdist sends the big groups, then single tests in collection order):
# started last, the model tests left one worker running alone for minutes at the end of the pass.
_FIRST_TIERS = ("model", "spark")
_SERVER_FIXTURES = {"ui_airflow"}  # tests/ui: a real local Airflow serving the MemWAL page
_SLOW_FILES = {"test_make_airflow.py"}  # tests/ui: `make airflow` end to end


def _params(item) -> list:
    """The values of the item's parameters (the `location` fixture's, and tests' own `where`, are "s3")."""
    callspec = getattr(item, "callspec", None)
    return list(callspec.params.values()) if callspec is not None else []


def pytest_collection_modifyitems(config, items):
    tests = Path(__file__).resolve().parent

    def rank(item) -> int:
        try:
            tier = Path(item.path).resolve().relative_to(tests).parts[0]
        except ValueError:
            return len(_FIRST_TIERS)
        return _FIRST_TIERS.index(tier) if tier in _FIRST_TIERS else len(_FIRST_TIERS)

    items.sort(key=rank)  # stable: modules stay whole and in order
    for item in items:
        try:
            parts = Path(item.path).resolve().relative_to(tests).parts
        except ValueError:
            continue
        tier = parts[0] if len(parts) > 1 else ""
        for name in _TIER_MARKS.get(tier, ()):
            item.add_marker(getattr(pytest.mark, name))
        if "s3_endpoint" in getattr(item, "fixturenames", ()) or "s3" in _params(item):
            item.add_marker(pytest.mark.s3)  # moto S3: `make test` only, the inner loop stays on local files
        group = _GROUPS.get(tier)
        if tier == "spark" and not _SPARK_SESSION_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            group = None
        if _SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())) or parts[-1] in _SLOW_FILES:
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.server)
            group = "server"
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
