"""The metadata DB's cleanup, as `dags/memwal_db_cleanup.py` runs it daily: `airflow db clean` of everything
older than the retention, a dry run unless told otherwise.

Settings: the Airflow Variable `memwal_db_cleanup` (JSON), every key optional:
    {"retention_days": 30,        # keep this many days of DAG runs, task instances, XComs, logs, ...
     "dry_run": true,             # true (the default): report what would be deleted, delete nothing
     "tables": ["dag_run", ...]}  # metadata tables to clean (default: all that `airflow db clean` knows)
A bad value fails the task naming the key. Airflow keeps the newest run of each DAG whatever the retention.

Why a subprocess: Airflow 3 blocks the ORM inside tasks (workers talk to the Execution API), and the task's
environment carries a blocked `sql_alchemy_conn`. The command is run with that blocked value removed, so the
worker's own configuration (airflow.cfg, `_CMD`, `_SECRET`) applies, or with the URI of the Airflow connection
`memwal_metadata_db` when it exists. A worker that cannot reach the metadata DB fails the task saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

__all__ = ["BLOCKED_CONN", "DB_CONN_ID", "VARIABLE", "CleanupSettings", "clean_command", "command_env",
           "parse_settings", "run_cleanup"]

VARIABLE = "memwal_db_cleanup"
DB_CONN_ID = "memwal_metadata_db"
BLOCKED_CONN = "airflow-db-not-allowed:///"
DEFAULT_RETENTION_DAYS = 30.0
_CONN_VARS = ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CORE__SQL_ALCHEMY_CONN")


@dataclass(frozen=True)
class CleanupSettings:
    """What to clean: rows older than retention_days, in `tables` (empty: all), for real only if not dry_run."""

    retention_days: float = DEFAULT_RETENTION_DAYS
    dry_run: bool = True
    tables: tuple[str, ...] = ()


def parse_settings(raw: Any) -> CleanupSettings:
    """The Variable's value (JSON text, a mapping, or None for the defaults); ValueError naming the key."""
    if raw in (None, ""):
        return CleanupSettings()
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"Variable {VARIABLE}: not JSON: {exc}") from None
    if not isinstance(raw, Mapping):
        raise ValueError(f"Variable {VARIABLE}: must be a JSON object, not {type(raw).__name__}")
    unknown = sorted(set(raw) - {"retention_days", "dry_run", "tables"})
    if unknown:
        raise ValueError(f"Variable {VARIABLE}: unknown key {unknown[0]!r} (known: retention_days, dry_run, tables)")
    days = raw.get("retention_days", DEFAULT_RETENTION_DAYS)
    if isinstance(days, bool) or not isinstance(days, int | float) or not 0 < days < 36500:
        raise ValueError(f"Variable {VARIABLE}: retention_days must be a number of days > 0, not {days!r}")
    dry_run = raw.get("dry_run", True)
    if not isinstance(dry_run, bool):
        raise ValueError(f"Variable {VARIABLE}: dry_run must be true or false, not {dry_run!r}")
    tables = raw.get("tables") or []
    if not isinstance(tables, list) or not all(isinstance(t, str) and t.isidentifier() for t in tables):
        raise ValueError(f"Variable {VARIABLE}: tables must be a list of metadata table names, not {tables!r}")
    return CleanupSettings(float(days), dry_run, tuple(tables))


def clean_command(settings: CleanupSettings, now: datetime | None = None) -> list[str]:
    """`airflow db clean` for these settings (no archive tables: the rows are gone, not moved)."""
    now = now or datetime.now(UTC)
    before = (now - timedelta(days=settings.retention_days)).astimezone(UTC).isoformat(timespec="seconds")
    airflow = shutil.which("airflow") or str(Path(sys.executable).with_name("airflow"))
    cmd = [airflow, "db", "clean", "--clean-before-timestamp", before, "--skip-archive", "--yes", "--verbose"]
    if settings.tables:
        cmd += ["--tables", ",".join(settings.tables)]
    if settings.dry_run:
        cmd.append("--dry-run")
    return cmd


def command_env(environ: Mapping[str, str], conn_uri: str | None = None) -> dict[str, str]:
    """The command's environment: the task's, without the blocked DB connection a task carries, and with
    `conn_uri` (the `memwal_metadata_db` connection's URI) when given."""
    env = {k: v for k, v in environ.items() if not (k in _CONN_VARS and v == BLOCKED_CONN)}
    if conn_uri:
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = conn_uri
    return env


def _connection_uri() -> str | None:
    try:
        from airflow.sdk import BaseHook

        return BaseHook.get_connection(DB_CONN_ID).get_uri()
    except Exception:  # not defined: the worker's own configuration
        return None


def run_cleanup(settings: CleanupSettings, *, now: datetime | None = None, timeout_s: float = 3600.0
                ) -> dict[str, Any]:
    """Run the command; returns {dry_run, clean_before, tables, output} (the output's last lines).
    RuntimeError naming the command's last lines when it fails."""
    cmd = clean_command(settings, now)
    proc = subprocess.run(cmd, env=command_env(os.environ, _connection_uri()), capture_output=True, text=True,
                          timeout=timeout_s)
    output = (proc.stdout + proc.stderr).strip().splitlines()
    if proc.returncode != 0:
        raise RuntimeError(f"airflow db clean failed (exit {proc.returncode}); if the worker cannot reach the "
                           f"metadata DB, define the connection {DB_CONN_ID!r}: " + " | ".join(output[-8:]))
    return {"dry_run": settings.dry_run, "clean_before": cmd[cmd.index("--clean-before-timestamp") + 1],
            "tables": list(settings.tables) or "all", "output": output[-60:]}
