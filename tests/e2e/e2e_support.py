"""What the end-to-end tests run beside Airflow: a Spark standalone cluster on loopback, a MemWAL table
written by Lance core with a model of every write, a webhook receiver, and recorders of every
spark-submit argv (a recording spark-submit in a SPARK_HOME of symlinks, and a /proc sampler)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lance
import pyarrow as pa
from ports import free_port  # scripts/ (tests/e2e/conftest.py)

from memwal.region_manifest import list_regions, load_latest_manifest
from memwal.storage import ObjectStore, lance_storage_options
from spark_jobs import submit

from support.jvm import FAST_JVM_OPTIONS

if TYPE_CHECKING:
    from local_airflow import LocalAirflow

REPO = Path(__file__).resolve().parents[2]



# -- Spark standalone ----------------------------------------------------------------------------------


class SparkStandalone:
    """A Spark master and one worker (from the pyspark distribution) on 127.0.0.1, as tests/spark does."""

    def __init__(self, workdir: Path, cores: int = 2, memory: str = "2g"):
        self.workdir = workdir
        self.cores, self.memory = cores, memory
        self.procs: list[subprocess.Popen] = []
        self._logs: list = []
        self.port, self.ui, self.worker_ui = free_port(), free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"

    def start(self) -> SparkStandalone:
        home = submit.spark_home()
        spark_class = str(Path(home) / "bin" / "spark-class")
        env = {**os.environ, "SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1",
               "SPARK_DAEMON_JAVA_OPTS": FAST_JVM_OPTIONS}
        self.workdir.mkdir(parents=True, exist_ok=True)

        def spawn(name: str, args: list[str]) -> None:
            out = open(self.workdir / f"{name}.log", "w")  # noqa: SIM115 - closed by stop()
            self._logs.append(out)
            self.procs.append(subprocess.Popen([spark_class, *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                                               stdin=subprocess.DEVNULL, cwd=self.workdir, start_new_session=True))

        spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port),
                         "--webui-port", str(self.ui)])
        spawn("worker", ["org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1", "--cores",
                         str(self.cores), "--memory", self.memory, "--webui-port", str(self.worker_ui),
                         "--work-dir", str(self.workdir / "work")])
        return self

    def log_files(self) -> list[Path]:
        """The master's and worker's logs and every executor's stdout/stderr (work/app-*/N/)."""
        return sorted(p for p in self.workdir.rglob("*") if p.is_file() and (
            p.suffix == ".log" or p.name in ("stdout", "stderr")))

    def wait_alive(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if any(w.get("state") == "ALIVE" for w in self.state().get("workers", [])):
                    return
            except (OSError, ValueError):
                pass
            if any(p.poll() is not None for p in self.procs) or time.monotonic() > deadline:
                tails = {p.name: p.read_text()[-1500:] for p in self.workdir.glob("*.log")}
                raise RuntimeError(f"Spark standalone cluster did not come up: {tails}")
            time.sleep(0.3)

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=3) as resp:
            return json.load(resp)

    def stop(self) -> None:
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, 15)
            except ProcessLookupError:
                pass
        for p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
        for f in self._logs:
            f.close()


@dataclass
class Deployment:
    """Everything the end-to-end tests talk to."""

    af: LocalAirflow
    tables: dict[str, LanceCoreTable]
    canary: str
    webhook: WebhookServer
    recorder: SparkSubmitRecorder
    sampler: ProcSampler
    spark: SparkStandalone
    tables_file: Path
    fault_dir: Path
    endpoint: str
    connect: Any = None  # spark_jobs.connect_server.ConnectServer of the `linked` table
    notes: list[str] = field(default_factory=list)
    fleet_root: Path | None = None  # the `fleet` root entry's directory: FLEET_TABLES idle local tables

    def connect_log_files(self) -> list[Path]:
        """The Spark Connect server's log and event log."""
        if self.connect is None or self.connect.log_path is None:
            return []
        return sorted(p for p in self.connect.log_path.parent.rglob("*") if p.is_file())

    def arm_driver_fault(self) -> None:
        """The next Spark driver of table `crashy` kills itself inside its second merge commit."""
        (self.fault_dir / "armed").write_text("1")

    def killed_drivers(self) -> list[str]:
        path = self.fault_dir / "killed-drivers"
        return path.read_text().split() if path.exists() else []


# -- S3 (the session's moto server) ---------------------------------------------------------------------


def s3_options(endpoint: str) -> dict[str, str]:
    """Lance storage options for the moto server (moto accepts any key pair)."""
    return {"aws_endpoint": endpoint, "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
            "aws_region": "us-east-1", "allow_http": "true"}


def new_bucket(endpoint: str) -> str:
    import boto3

    name = f"memwal-e2e-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket=name)
    return name


# -- a MemWAL table written by Lance core, and its model --------------------------------------------------

PK = {"lance-schema:unenforced-primary-key": "true"}
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("name", pa.string()),
                    pa.field("score", pa.float64())])
Model = dict[int, tuple[str, float]]


def rows(ids, tag: str) -> pa.Table:
    ids = [int(i) for i in ids]
    return pa.table({"id": ids, "name": [f"{tag}{i}" for i in ids], "score": [i / 2 for i in ids]}, schema=SCHEMA)


@dataclass
class LanceCoreTable:
    """A table on S3 (or local) whose base table and MemWAL regions Lance core (pylance) wrote; `model` is
    id -> (name, score) after every acknowledged write, what the base table must equal once merged."""

    uri: str
    storage_options: dict[str, str] | None
    model: Model = field(default_factory=dict)
    regions: list[str] = field(default_factory=list)

    def _opts(self) -> dict[str, str] | None:
        return lance_storage_options(self.storage_options)

    def create(self, base_ids=range(20), index: bool = True) -> LanceCoreTable:
        ds = lance.write_dataset(rows(base_ids, "base"), self.uri, storage_options=self._opts())
        ds.initialize_mem_wal(unsharded=True)
        if index:
            lance.dataset(self.uri, storage_options=self._opts()).create_scalar_index("name", "BTREE",
                                                                                      name="name_idx")
        self.model = {i: (f"base{i}", i / 2) for i in base_ids}
        return self

    def write_generations(self, region: str | None, rounds: int, offset: int, tag: str) -> str:
        """Through Lance core's ShardWriter (max 8 rows per MemTable) in `region` (new if None): `rounds` of 8
        upserts (overlapping the previous round) and a delete; Lance core flushes each put and each delete
        as a generation of its own (2 per round). Returns the region id."""
        region = region or str(uuid.uuid4())
        if region not in self.regions:
            self.regions.append(region)
        ds = lance.dataset(self.uri, storage_options=self._opts())
        with ds.mem_wal_writer(region, max_memtable_rows=8) as w:
            for g in range(rounds):
                ids = [offset + 4 * g + i for i in range(8)]
                w.put(rows(ids, f"{tag}{g}-"))
                self.model.update({i: (f"{tag}{g}-{i}", i / 2) for i in ids})
                dead = [offset + 4 * g + 1]
                w.delete(pa.table({"id": pa.array(dead, pa.int64())}))
                for i in dead:
                    self.model.pop(i, None)
        return region

    def flushed(self) -> dict[str, list[int]]:
        """Region id -> the flushed generation numbers in its latest manifest."""
        store = ObjectStore(self.uri, self.storage_options)
        return {r: [fg.generation for fg in load_latest_manifest(store, r).flushed_generations]
                for r in list_regions(store)}

    def base(self) -> Model:
        """id -> (name, score) of the base table; fails on a key present twice (a row applied twice)."""
        out: Model = {}
        table = lance.dataset(self.uri, storage_options=self._opts()).to_table(columns=["id", "name", "score"])
        for r in table.to_pylist():
            assert r["id"] not in out, f"primary key {r['id']} is in the base table twice: a row applied twice"
            out[r["id"]] = (r["name"], r["score"])
        return out

    def merged_generations(self) -> dict[str, int]:
        from memwal.mem_wal_index import load_index

        return dict(load_index(self.uri, self.storage_options).merged_generations)


# -- a webhook receiver ---------------------------------------------------------------------------------


class WebhookServer:
    """An HTTP server on 127.0.0.1 that records every POSTed JSON body (what a Slack-style webhook gets)."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        self._lock = threading.Lock()
        received, lock = self.received, self._lock

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    payload = json.loads(body or b"null")
                except ValueError:
                    payload = {"_raw": body.decode(errors="replace")}
                with lock:
                    received.append({"path": self.path, "body": payload, "at": time.time()})
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # The path carries a unique token, as a Slack webhook URL does: the whole URL is a secret (docs/airflow.md).
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook/{uuid.uuid4().hex}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="webhook", daemon=True)

    def start(self) -> WebhookServer:
        self._thread.start()
        return self

    def messages(self) -> list[dict]:
        with self._lock:
            return list(self.received)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- spark-submit argv recorders ------------------------------------------------------------------------


RECORD_SPARK_SUBMIT = """\
import hashlib, json, sys

log, argv = sys.argv[1], sys.argv[2:]
secret_sha256 = None
for i, arg in enumerate(argv[:-1]):
    if arg == "--storage-options-json" and argv[i + 1].startswith("@"):
        try:
            with open(argv[i + 1][1:]) as f:
                secret = json.load(f).get("aws_secret_access_key")
            secret_sha256 = hashlib.sha256(secret.encode()).hexdigest() if secret else None
        except (OSError, ValueError):
            secret_sha256 = "unreadable"
with open(log, "a") as f:
    f.write(json.dumps({"argv": argv, "secret_sha256": secret_sha256}) + "\\n")
"""


class SparkSubmitRecorder:
    """A SPARK_HOME of symlinks to pyspark's whose bin/spark-submit records its argv and then runs the real one.
    Put `bin` first on PATH and point SPARK_HOME here: both the Spark provider's hook (spark-submit from PATH)
    and spark_jobs.submit (SPARK_HOME/bin) then go through it. Besides the argv it records the SHA-256 of the
    S3 secret in the `--storage-options-json @FILE` it was given (the file exists only while the job runs):
    proof that the connection's secret reached the job by file, without recording the secret."""

    def __init__(self, root: Path):
        self.root = root
        self.log = root / "spark-submit-argv.jsonl"

    def install(self) -> SparkSubmitRecorder:
        real = Path(submit.spark_home())
        home = self.root / "spark-home"
        (home / "bin").mkdir(parents=True, exist_ok=True)
        for entry in real.iterdir():
            if entry.name != "bin":
                (home / entry.name).symlink_to(entry)
        for entry in (real / "bin").iterdir():
            if entry.name != "spark-submit":
                (home / "bin" / entry.name).symlink_to(entry)
        recorder = self.root / "record_spark_submit.py"
        recorder.write_text(RECORD_SPARK_SUBMIT)
        wrapper = home / "bin" / "spark-submit"
        wrapper.write_text(
            "#!/bin/sh\n"
            f"\"{sys.executable}\" \"{recorder}\" \"{self.log}\" \"$@\"\n"
            f"exec \"{real / 'bin' / 'spark-submit'}\" \"$@\"\n"
        )
        wrapper.chmod(0o755)
        self.log.touch()
        self.spark_home = str(home)
        self.bin = str(home / "bin")
        return self

    def records(self) -> list[dict]:
        """One per spark-submit run: argv, secret_sha256 (of the options file's secret key, or None)."""
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def argvs(self) -> list[list[str]]:
        return [r["argv"] for r in self.records()]


class ProcSampler:
    """Samples the command line of every process on the machine every `interval` seconds while running: keeps
    those that match KEEP (spark-submit, the JVM's SparkSubmit, the Python driver of a job) and every one
    that contains one of `needles` (a secret that must never be on a command line)."""

    KEEP = ("spark-submit", "SparkSubmit", "spark_jobs/")

    def __init__(self, needles: tuple[str, ...] = (), interval: float = 0.1):
        self.interval = interval
        self.needles = needles
        self.seen: dict[tuple[int, str], list[str]] = {}
        self.leaks: dict[tuple[int, str], list[str]] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="proc-sampler", daemon=True)

    def start(self) -> ProcSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            for entry in os.listdir("/proc"):
                if not entry.isdigit() or int(entry) == me:
                    continue
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        raw = f.read()
                except OSError:
                    continue
                argv = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
                joined = " ".join(argv)
                if any(k in joined for k in self.KEEP):
                    self.seen.setdefault((int(entry), joined), argv)
                if any(n in joined for n in self.needles):
                    self.leaks.setdefault((int(entry), joined), argv)
            self.samples += 1
            self._stop.wait(self.interval)

    def argvs(self) -> list[list[str]]:
        return list(self.seen.values())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
