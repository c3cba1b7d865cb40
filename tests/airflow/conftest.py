"""Fixtures for the Airflow tests: one Airflow home on SQLite per session (`airflow db migrate` once);
DAG runs happen in child processes (airflow_support.run_dag) so this process never imports Airflow's
settings with another home."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from airflow_support import airflow_env, migrate


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory) -> dict[str, str]:
    """The environment of a migrated SQLite Airflow home (dags/ of this repository, no plugins)."""
    home = tmp_path_factory.mktemp("airflow_home")
    env = airflow_env(home)
    migrate(env)
    return env
