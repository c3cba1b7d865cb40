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
from s3_decoy import isolate_environment

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
