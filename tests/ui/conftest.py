"""Fixtures for the MemWAL page tests: a small MemWAL table, a tables file naming it, and one real local
Airflow (scripts/local_airflow.py: api-server, scheduler, dag-processor, triggerer) with this repository's
plugins/ and dags/, shared by the security and browser tests of this session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TABLE = "ui_demo"
S3_TABLE = "ui_s3"
S3_CONN = "ui_s3_storage"
#: The S3 table's secret key (moto accepts any): it must never reach the page.
S3_SECRET = "ui-canary-7f3a9c2e51"
#: Positive controls: the same S3 table through a connection without its endpoint (host) or its keys.
S3_CONTROLS = {"ui_s3_no_endpoint": ("host",), "ui_s3_no_keys": ("login", "password")}


@pytest.fixture(scope="session")
def ui_table(tmp_path_factory) -> Path:
    """A 4-region table written by our writer with 2 unmerged generations per region (`memwal.demo`)."""
    path = tmp_path_factory.mktemp("ui") / "table.lance"
    subprocess.run([sys.executable, "-m", "memwal.demo", "write", str(path), "--base-rows", "2000",
                    "--batches", "3", "--batch-rows", "400"], check=True, capture_output=True, text=True)
    return path


@pytest.fixture(scope="session")
def ui_s3_table(s3_endpoint) -> str:
    """A table on S3 (moto) with one unmerged generation per region, read through a `memwal` connection."""
    import lance

    from memwal.storage import lance_storage_options
    from memwal.table_writer import TableWriter
    from memwal.writer import WriterConfig

    from support.locations import new_bucket, s3_options
    from support.tables import rows

    uri = f"s3://{new_bucket(s3_endpoint)}/table.lance"
    options = {**s3_options(s3_endpoint), "aws_secret_access_key": S3_SECRET}
    ds = lance.write_dataset(rows(range(100)), uri, storage_options=lance_storage_options(options))
    ds.initialize_mem_wal(bucket_column="id", num_buckets=2)
    with TableWriter(uri, storage_options=options, config=WriterConfig(max_flush_interval_s=None)) as w:
        w.put(rows(range(50, 150), "gen1"))
        w.flush()
    return uri


@pytest.fixture(scope="session")
def ui_tables_file(ui_table: Path, ui_s3_table: str) -> Path:
    """The tables file: the table in-process (no Spark needed to merge it), low thresholds so rows are marked."""
    path = ui_table.parent / "tables.yaml"
    path.write_text(
        "tables:\n"
        f"  {TABLE}:\n"
        f"    uri: {ui_table}\n"
        "    engine: in_process\n"
        "    schedule: null\n"
        "    thresholds:\n"
        "      max_unmerged_generations: 1\n"
        "      max_index_lag: 5\n"
        f"  {S3_TABLE}:\n"
        f"    uri: {ui_s3_table}\n"
        f"    conn_id: {S3_CONN}\n"
        "    engine: in_process\n"
        "    schedule: null\n"
        + "".join(f"  {name}:\n    uri: {ui_s3_table}\n    conn_id: {name}\n    engine: in_process\n"
                  "    schedule: null\n" for name in S3_CONTROLS)
    )
    return path


@pytest.fixture(scope="session")
def ui_airflow(ui_tables_file: Path, s3_endpoint: str):
    """A real local Airflow serving the MemWAL page (users: admin, viewer)."""
    sys.path.insert(0, str(REPO / "scripts"))
    from local_airflow import LocalAirflow

    conn = {"conn_type": "memwal", "host": s3_endpoint, "login": "testing", "password": S3_SECRET,
            "extra": {"region": "us-east-1", "allow_http": True}}
    controls = {name: {k: v for k, v in conn.items() if k not in removed} for name, removed in S3_CONTROLS.items()}
    # the S3 control tables fail their lag checks by design (the monitor's run fails, naming them)
    af = LocalAirflow(tables_file=str(ui_tables_file), connections={S3_CONN: conn, **controls},
                      reparse_interval=300)
    af.start()
    try:
        yield af
    finally:
        af.stop()
        af.cleanup_home()
