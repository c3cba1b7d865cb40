"""The end-to-end deployment, started once per module: a real Airflow (scripts/local_airflow.py: api-server,
scheduler, dag-processor, triggerer, LocalExecutor; metadata on PostgreSQL, a fresh database, else SQLite),
a Spark standalone master and worker on 127.0.0.1, MemWAL tables on S3 (the session's moto server)
written by Lance core, the storage credentials in an Airflow Connection of type `memwal` given through
the environment (its secret key is a unique canary), a webhook receiver for lag alerts, and recorders of
every spark-submit argv.

Tables (the tables file given through MEMWAL_TABLES_FILE), one per scenario so they do not interfere:
- `orders`  (spark)       a merge through the REST API;
- `clicks`  (in_process)  memwal_merge and the maintenance DAG at once;
- `events`  (in_process)  held behind its threshold: alert, event-driven maintenance, resolved alert;
- `crashy`  (spark)       its Spark driver is SIGKILLed inside a merge commit once (memwal.faults);
- `linked`  (spark_connect) the maintenance DAG with its executor work on a local Spark Connect server
  (started once for the deployment, its log and event log searched by the canary test);
- `fleet`   a root entry (in_process): FLEET_TABLES tiny local tables, copies of one idle table, for the
  fleet DAGs (dags/memwal_fleet.py; their schedule is off: the test triggers the probe).
No table has a clock schedule (`schedule: null`): runs start only from the tests and from lag assets.

MEMWAL_E2E_DATABASE=sqlite|postgres|auto (default auto) picks the metadata database.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import uuid
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from e2e_support import (
    Deployment,
    LanceCoreTable,
    ProcSampler,
    SparkStandalone,
    SparkSubmitRecorder,
    WebhookServer,
    new_bucket,
    s3_options,
)
from local_airflow import LocalAirflow
from ports import free_port

from support.jvm import FAST_JVM_OPTIONS

log = logging.getLogger("e2e")

CONN_STORAGE = "memwal_lake"
CONN_SPARK = "memwal_spark_e2e"
CONN_ALERTS = "memwal_alerts"
CONN_CONNECT = "memwal_spark_connect_e2e"
FAULT = "merge.before_commit"
FLEET_TABLES = 100


def _driver_wrapper(fault_dir: Path) -> Path:
    """spark.pyspark.driver.python of table `crashy`: the venv Python, with the fault point armed for the one
    driver that removes the `armed` file (rm is atomic: exactly one driver gets the fault)."""
    path = fault_dir / "driver-python"
    path.write_text(
        "#!/bin/sh\n"
        f"if rm \"{fault_dir}/armed\" 2>/dev/null; then\n"
        f"  export MEMWAL_FAULT={FAULT} MEMWAL_FAULT_SKIP=1\n"
        f"  echo $$ >> \"{fault_dir}/killed-drivers\"\n"
        "fi\n"
        f"exec \"{sys.executable}\" \"$@\"\n"
    )
    path.chmod(0o755)
    return path


def _fleet_tables(root: Path, count: int) -> None:
    """`count` idle MemWAL tables under root (t000.lance ...): one written by Lance core, then copied."""
    first = root / "t000.lance"
    LanceCoreTable(str(first), None).create()
    for i in range(1, count):
        shutil.copytree(first, root / f"t{i:03d}.lance")


def _tables_file(path: Path, bucket: str, driver_python: Path, fleet_root: Path) -> Path:
    spark_conf = {
        "spark.driver.extraJavaOptions": FAST_JVM_OPTIONS,
        "spark.executor.extraJavaOptions": FAST_JVM_OPTIONS,
        "spark.cores.max": "1",
        "spark.executor.memory": "512m",
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": "false",
    }
    spark = {"engine": "spark", "spark_conn_id": CONN_SPARK, "spark_conf": spark_conf}
    common = {"conn_id": CONN_STORAGE, "schedule": None, "max_generations_per_commit": 2,
              "max_merge_applications": 2, "gc": {"enabled": True, "keep_manifest_versions": 2}}
    tables = {
        "orders": {"uri": f"s3://{bucket}/orders", **common, **spark},
        "clicks": {"uri": f"s3://{bucket}/clicks", **common, **spark, "engine": "in_process"},
        "events": {"uri": f"s3://{bucket}/events", **common, "engine": "in_process",
                   "thresholds": {"max_unmerged_generations": 2}},
        "crashy": {"uri": f"s3://{bucket}/crashy", **common, **spark,
                   "spark_conf": {**spark_conf, "spark.pyspark.driver.python": str(driver_python)}},
        "linked": {"uri": f"s3://{bucket}/linked", **common, "engine": "spark_connect",
                   "spark_connect_conn_id": CONN_CONNECT},
        "fleet": {"root": str(fleet_root), "engine": "in_process", "max_generations_per_commit": 2},
    }
    path.write_text("# written by tests/e2e/conftest.py\n" + yaml.safe_dump({"tables": tables}, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def deployment(s3_endpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    canary = f"canary-{uuid.uuid4().hex}"
    bucket = new_bucket(s3_endpoint)
    # moto accepts any key pair: the secret access key in the connection is the canary itself.
    storage = {**s3_options(s3_endpoint), "aws_secret_access_key": canary}
    fault_dir = root / "fault"
    fault_dir.mkdir()
    fleet_root = root / "fleet"
    fleet_root.mkdir()
    tables_file = _tables_file(root / "memwal_tables.yaml", bucket, _driver_wrapper(fault_dir), fleet_root)

    spark = SparkStandalone(root / "spark").start()
    from spark_jobs.connect_server import ConnectServer

    (root / "connect" / "events").mkdir(parents=True)
    connect = ConnectServer(master="local[1]", port=free_port(), log_path=root / "connect" / "server.log",
                            event_log_dir=f"file://{root / 'connect' / 'events'}",
                            conf={"spark.driver.extraJavaOptions": FAST_JVM_OPTIONS,
                                  "spark.eventLog.compress": "false"})
    webhook = WebhookServer().start()
    recorder = SparkSubmitRecorder(root / "recorder").install()
    sampler = ProcSampler(needles=(canary, webhook.url)).start()
    connections = {
        CONN_STORAGE: {"conn_type": "memwal", "host": s3_endpoint, "login": storage["aws_access_key_id"],
                       "password": canary, "extra": {"region": "us-east-1", "allow_http": True}},
        CONN_SPARK: {"conn_type": "spark", "host": "spark://127.0.0.1", "port": spark.port},
        CONN_ALERTS: webhook.url,
        CONN_CONNECT: {"conn_type": "spark_connect", "host": "127.0.0.1", "port": connect.port},
    }
    env = {
        "SPARK_HOME": recorder.spark_home,
        "PATH": f"{recorder.bin}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "MEMWAL_LOCK_LEASE_S": "4",  # a driver killed inside a commit holds the MemWAL index lock one lease
        "MEMWAL_LAG_MONITOR_SCHEDULE": "@once",  # one run when the test unpauses it; then triggered by the test
        # The DAGs retry after 60 s+ (exponential backoff); the deployment caps retry delays for the crash test.
        "AIRFLOW__CORE__MAX_TASK_RETRY_DELAY": "5",
        "MEMWAL_FLEET_SCHEDULE": "none",  # the fleet test triggers each probe cycle itself
    }
    af = LocalAirflow(home=str(root / "airflow"), tables_file=str(tables_file),
                      database=os.environ.get("MEMWAL_E2E_DATABASE", "auto"), connections=connections, env=env,
                      reparse_interval=300)  # the DAG files and tables file never change during the module

    tables: dict[str, LanceCoreTable] = {}
    errors: list[BaseException] = []

    def write_tables() -> None:  # Lance core writes the tables while Airflow starts
        try:
            for name in ("orders", "clicks", "events", "crashy", "linked"):
                t = LanceCoreTable(f"s3://{bucket}/{name}", storage).create()
                for k in range(2):
                    t.write_generations(None, rounds=4 if name != "events" else 3, offset=100 * (k + 1),
                                        tag=f"{name}{k}-")
                tables[name] = t
            _fleet_tables(fleet_root, FLEET_TABLES)
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=write_tables, name="write-tables")
    writer.start()
    try:
        connect.start()
        af.start()
        writer.join()
        if errors:
            raise errors[0]
        spark.wait_alive()
        dep = Deployment(af=af, tables=tables, canary=canary, webhook=webhook, recorder=recorder, sampler=sampler,
                         spark=spark, tables_file=tables_file, fault_dir=fault_dir, endpoint=s3_endpoint,
                         connect=connect, fleet_root=fleet_root)
        if af.backend != "postgresql":
            dep.notes.append(f"the Airflow metadata database is {af.backend}: no PostgreSQL answered on "
                             "127.0.0.1:5432 (or MEMWAL_E2E_DATABASE asked for it)")
            log.warning("%s", dep.notes[-1])
        yield dep
    finally:
        writer.join()
        af.stop(timeout=5)
        sampler.stop()
        webhook.stop()
        spark.stop()
        connect.stop()
        log.info("e2e: Airflow home with every log: %s", af.home)


