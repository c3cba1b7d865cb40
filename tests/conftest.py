"""Shared fixtures: table locations on the local filesystem and on a real S3-compatible endpoint
(moto_server on 127.0.0.1, started once per test session as a subprocess)."""

from __future__ import annotations

import http.server
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from memwal.storage import ObjectStore

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


DECOY_MESSAGE = "decoy S3 endpoint of the test environment: the code under test did not pass its own endpoint"


class _Decoy(http.server.BaseHTTPRequestHandler):
    """Answers every request at once with an S3 error naming itself, so a client that fell back to the
    environment fails fast and says why (a closed port would be retried for minutes)."""

    def _refuse(self) -> None:
        body = f"<Error><Code>InvalidAccessKeyId</Code><Message>{DECOY_MESSAGE}</Message></Error>".encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _refuse

    def log_message(self, *args: object) -> None:
        pass


def _start_decoy() -> str:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Decoy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


# S3 tests see S3 only through what the code under test passes. The environment of this process and of
# every child (Airflow, spark-submit, Spark workers, the CLI) points S3 at a loopback decoy that refuses
# everything and carries no keys, so a connection, hook or job that drops its endpoint or keys fails.
# Instance metadata is off (boto3, Lance) or at the decoy (obstore), never a real address.
DECOY_ENDPOINT = os.environ.get("MEMWAL_TEST_S3_DECOY") or _start_decoy()  # once, if imported twice
os.environ["MEMWAL_TEST_S3_DECOY"] = DECOY_ENDPOINT
for _k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ALLOW_HTTP", "AWS_PROFILE"):
    os.environ.pop(_k, None)
os.environ.update({
    "AWS_ENDPOINT": DECOY_ENDPOINT, "AWS_ENDPOINT_URL": DECOY_ENDPOINT, "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_METADATA_ENDPOINT": DECOY_ENDPOINT, "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
})


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


#: What a positive control removes from S3 storage options (or from a connection: host, login/password).
S3_REMOVALS = {"endpoint": ("aws_endpoint",), "keys": ("aws_access_key_id", "aws_secret_access_key")}
#: How S3 access without the removed part fails: the decoy refuses it, or no credentials are found.
NOT_REACHED = re.compile(r"decoy S3 endpoint|credential", re.IGNORECASE)


def s3_options_without(options: dict[str, str], removed: str) -> dict[str, str]:
    """The storage options with the endpoint or the keys removed (for a positive control)."""
    return {k: v for k, v in options.items() if k not in S3_REMOVALS[removed]}


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
