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


@pytest.fixture(scope="session")
def ui_table(tmp_path_factory) -> Path:
    """A 4-region table written by our writer with 2 unmerged generations per region (`memwal.demo`)."""
    path = tmp_path_factory.mktemp("ui") / "table.lance"
    subprocess.run([sys.executable, "-m", "memwal.demo", "write", str(path), "--base-rows", "2000",
                    "--batches", "3", "--batch-rows", "400"], check=True, capture_output=True, text=True)
    return path


@pytest.fixture(scope="session")
def ui_tables_file(ui_table: Path) -> Path:
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
    )
    return path


@pytest.fixture(scope="session")
def ui_airflow(ui_tables_file: Path):
    """A real local Airflow serving the MemWAL page (users: admin, viewer)."""
    sys.path.insert(0, str(REPO / "scripts"))
    from local_airflow import LocalAirflow

    af = LocalAirflow(tables_file=str(ui_tables_file))
    af.start()
    try:
        yield af
    finally:
        af.stop()
        af.cleanup_home()
