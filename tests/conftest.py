"""Shared fixtures: table locations on the local filesystem and on a real S3-compatible endpoint
(moto_server on 127.0.0.1, started once per test session as a subprocess)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from support import atomic_moto
from support.jvm import FAST_JVM_OPTIONS
from support.locations import Location, new_bucket, s3_options
from support.s3_decoy import isolate_environment

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from ports import free_port  # noqa: E402  (re-exported for the tests)

# S3 tests see S3 only through what the code under test passes: from here on, this process and every child
# (Airflow, spark-submit, Spark workers, the CLI) have an environment whose S3 is a refusing decoy.
isolate_environment()


@pytest.fixture(scope="session")
def s3_endpoint():
    """A moto S3 server on 127.0.0.1 for this test session; yields its endpoint URL. Nothing reaches it
    unless the code under test passes this endpoint (see the decoy above)."""
    proc, endpoint = atomic_moto.start(free_port())  # moto_server, its conditional writes atomic as on S3
    yield endpoint
    proc.terminate()
    proc.wait(timeout=10)


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
# Every JVM the suite starts (spark-submit's driver, pyspark's gateway, the standalone daemons; children inherit
# it) runs with the test-only flags of support.jvm, also where a test gives Spark no configuration of its own.
for _opts in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
    os.environ.setdefault(_opts, FAST_JVM_OPTIONS)


@pytest.fixture(autouse=True, scope="session")
def _spark_python():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


# --- Tiers and cores (issue 34). `make test-fast` deselects the slow tiers by marker; `make test` runs with
# pytest-xdist (--dist loadgroup --no-loadscope-reorder): tests that share a server or a per-session resource
# carry an xdist_group, so each group runs in order on one worker while independent tests spread over the others.
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
# (tests/spark/conftest.py); the DAG tests share one migrated Airflow home (tests/airflow/conftest.py); each
# real-Airflow module builds on its own deployment (tests/e2e, tests/deploy: a module fixture; tests/ui: the
# session's `ui_airflow`), so one group per deployment: "server-<module>", "server-ui".
_GROUPS = {"spark": "spark", "airflow": "airflow"}
_SERVER_TIERS = ("e2e", "deploy")
# Only the Spark tests on those session fixtures share a worker; the ones that start their own spark-submit
# (the CLI, the submit and security tests) spread over the workers.
_SPARK_SESSION_FIXTURES = {"spark", "standalone_master", "connect_server"}
_SERVER_FIXTURES = {"ui_airflow"}  # tests/ui: a real local Airflow serving the MemWAL page
_SLOW_FILES = {"test_make_airflow.py"}  # tests/ui: `make airflow` end to end
# Work starts in this order (xdist hands out groups and single tests as collected, --no-loadscope-reorder): the
# longest chains first, the real Airflow's module (about half the run), then the DAG tests' group and the model
# tests (the longest single tests); started last, any of them would hold one worker alone at the end of the run.
_FIRST_TIERS = ("e2e", "airflow", "model", "spark", "ui", "deploy")


def _params(item) -> list:
    """The values of the item's parameters (the `location` fixture's, and tests' own `where`, are "s3")."""
    callspec = getattr(item, "callspec", None)
    return list(callspec.params.values()) if callspec is not None else []


def _group(tier: str, parts: tuple[str, ...], fixtures: set[str]) -> str | None:
    """The item's xdist group (None: it runs wherever a worker is free)."""
    module = Path(parts[-1]).stem
    if tier in _SERVER_TIERS or parts[-1] in _SLOW_FILES:
        return f"server-{module}"
    if _SERVER_FIXTURES & fixtures:
        return "server-ui"
    if tier == "spark" and not _SPARK_SESSION_FIXTURES & fixtures:
        return None
    return _GROUPS.get(tier)


# tryfirst: xdist's worker names each item's group (nodeid@group) in its own collection_modifyitems, from the
# xdist_group markers present then; run after it, these markers would be seen by nobody and every "group" split.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    tests = Path(__file__).resolve().parent

    def parts_of(item) -> tuple[str, ...]:
        try:
            return Path(item.path).resolve().relative_to(tests).parts
        except ValueError:
            return ()

    def rank(item) -> int:
        parts = parts_of(item)
        tier = parts[0] if parts else ""
        return _FIRST_TIERS.index(tier) if tier in _FIRST_TIERS else len(_FIRST_TIERS)

    items.sort(key=rank)  # stable: modules stay whole and in order
    for item in items:
        parts = parts_of(item)
        if not parts:
            continue
        tier = parts[0] if len(parts) > 1 else ""
        fixtures = set(getattr(item, "fixturenames", ()))
        for name in _TIER_MARKS.get(tier, ()):
            item.add_marker(getattr(pytest.mark, name))
        if "s3_endpoint" in fixtures or "s3" in _params(item):
            item.add_marker(pytest.mark.s3)  # moto S3: `make test` only, the inner loop stays on local files
        group = _group(tier, parts, fixtures)
        if group and group.startswith("server-") and tier not in _SERVER_TIERS:
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.server)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reports its collection to the controller
def pytest_collection_finish(session):
    """Under `--dist loadgroup`, stop the run if xdist did not name an item's group in its id: the groups would
    silently split (pytest 9.2 keeps ids where xdist 3.8 cannot rename them; requirements.txt pins around it)."""
    if not (os.environ.get("PYTEST_XDIST_WORKER") and session.config.getvalue("loadgroup")):
        return
    lost = [item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        message = (f"xdist ignored the xdist_group of {len(lost)} tests (e.g. {lost[0]}): pytest and pytest-xdist "
                   "disagree on node ids; use the versions pinned in requirements.txt")
        sys.__stderr__.write(f"\n{message}\n")  # the controller shows a worker's collection error only as a crash
        raise pytest.UsageError(message)
