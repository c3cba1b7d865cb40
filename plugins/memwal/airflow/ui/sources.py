"""Where the page's data comes from: the table (status), the lag history, and Airflow's DAG runs.

Status is read from the table itself through the table's connection (the same `memwal status` code), and
so is what a search pays now (`memwal.search_costs`, the numbers of `memwal status --search`);
the lag history is what the lag monitor recorded (`memwal.airflow.history`); maintenance runs and their
job summaries come from Airflow's metadata DB, filtered to the DAGs the signed-in user may read.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity

from memwal.airflow.ui.auth import MERGE_DAG_ID, can_read_dag
from memwal.airflow.ui.regions import COLUMNS, TableView, index_rows, region_rows, threshold

log = logging.getLogger(__name__)

__all__ = ["history_points", "maintenance_dag_id", "recent_runs", "search_costs_of", "table_status", "table_view"]

#: Summary keys of the table-level lag shown in the chart (from `memwal status --json`).
HISTORY_SERIES = ("unmerged_generations", "max_index_lag_generations")


def maintenance_dag_id(table: str) -> str:
    return f"memwal_maintenance__{table}"


def _storage_options(cfg: Any) -> dict[str, str] | None:
    """Storage options from the table's Airflow connection (None: the environment's defaults)."""
    conn_id = getattr(cfg, "conn_id", None)
    if not conn_id:
        return None
    from memwal.airflow.hooks.memwal import MemWalHook

    hook = MemWalHook(memwal_conn_id=conn_id)
    options = hook.storage_options
    return options() if callable(options) else options


def table_status(cfg: Any) -> tuple[dict, int | None]:
    """`memwal status --json` of the table with its health, counted against the table's compaction policy as
    the lag monitor counts it (`memwal.airflow.monitor.measure_table`; the storage reading is taken now: the
    page is read on demand), and its region snapshot timestamp (ms, None if never)."""
    from memwal.airflow.monitor import measure_table
    from memwal.table import MemWalTable

    status = measure_table(cfg, MemWalTable(cfg.uri, _storage_options(cfg)), storage=True)
    return status, status.get("snapshot_ts_millis")


def search_costs_of(cfg: Any) -> list[dict]:
    """Per vector or FTS index of the table: sources a search asks through an index, flat sources and rows
    served flat on the latest snapshot (`memwal.search_costs.search_costs`; opens each unmerged generation)."""
    from memwal.search_costs import search_costs
    from memwal.table import MemWalTable

    return search_costs(MemWalTable(cfg.uri, _storage_options(cfg)))


def history_points(table: str, since: datetime) -> list[dict]:
    """The lag monitor's records for the table since `since`: [{"at": datetime, series...}], oldest first."""
    from memwal.airflow import history

    points = []
    for rec in history.read(table, since):
        at = rec.get("at")
        if isinstance(at, str):
            at = datetime.fromisoformat(at)
        if at is None:
            continue
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
        summary = rec.get("status_summary") or rec.get("summary") or rec
        points.append({"at": at, **{k: summary.get(k) for k in HISTORY_SERIES}})
    points.sort(key=lambda p: p["at"])
    return points


def _summaries(session: Any, dag_id: str, run_id: str) -> list[dict]:
    """The job summaries (XCom return values with a "job" key) pushed by the run's tasks."""
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    rows = session.scalars(
        select(XComModel).where(
            XComModel.dag_id == dag_id, XComModel.run_id == run_id, XComModel.key == "return_value"
        ).order_by(XComModel.task_id, XComModel.map_index)
    ).all()
    out = []
    for row in rows:
        value = XComModel.deserialize_value(row)
        if isinstance(value, dict) and "job" in value:
            out.append({"task_id": row.task_id, "map_index": row.map_index, **value})
    return out


def summarize(summaries: list[dict]) -> str:
    """One line per run from its job summaries, in the words of `memwal` (merged, rows, failures)."""
    parts = []
    for s in summaries:
        job = s.get("job")
        if job == "merge":
            parts.append(f"merge: {s.get('generations_merged', 0)} generations, "
                         f"{s.get('rows_upserted', 0)} rows upserted, {s.get('rows_deleted', 0)} deleted"
                         + (", dry run" if s.get("dry_run") else "")
                         + (f", {len(s['failed_regions'])} regions failed" if s.get("failed_regions") else ""))
        elif job == "catchup":
            parts.append(f"catch-up: {len(s.get('indexes', []))} indexes")
        elif job == "snapshot":
            parts.append(f"snapshot: {s.get('num_regions', 0)} regions")
        elif job == "compaction":
            parts.append("compaction: " + (
                f"{s.get('tasks_committed', 0)} tasks, fragments {s['health_before'].get('fragments')} -> "
                f"{s['health_after'].get('fragments')}" if s.get("compacted") else
                ("disabled" if s.get("enabled") is False else "not due")))
        elif job == "retention":
            parts.append(f"retention: {s.get('num_versions_removed', 0)} versions, "
                         f"{s.get('bytes_removed', 0)} bytes" + (" (dry run)" if s.get("dry_run") else ""))
        elif job == "gc":
            counts = s.get("deleted") or s.get("would_delete") or {}
            parts.append(f"gc: {sum(counts.values()) if isinstance(counts, dict) else counts} objects"
                         + (" (dry run)" if s.get("dry_run") else ""))
        elif job:
            parts.append(str(job))
    return "; ".join(parts)


def recent_runs(table: str, user: BaseUser, limit: int = 8) -> list[dict]:
    """The table's latest maintenance and merge runs, newest first, with their summaries."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    runs: list[dict] = []
    with create_session() as session:
        for dag_id in (maintenance_dag_id(table), MERGE_DAG_ID):
            if not can_read_dag(user, dag_id):
                continue
            query = select(DagRun).where(DagRun.dag_id == dag_id).order_by(DagRun.run_after.desc())
            # memwal_merge serves every table: keep the runs whose conf names this one.
            query = query.limit(limit if dag_id != MERGE_DAG_ID else limit * 10)
            read_xcom = can_read_dag(user, dag_id, DagAccessEntity.XCOM)
            taken = 0
            for dr in session.scalars(query):
                conf = dr.conf or {}
                if dag_id == MERGE_DAG_ID and conf.get("table") != table:
                    continue
                summaries = _summaries(session, dag_id, dr.run_id) if read_xcom else []
                runs.append({
                    "dag_id": dag_id,
                    "run_id": dr.run_id,
                    "state": str(dr.state.value if hasattr(dr.state, "value") else dr.state),
                    "run_type": str(dr.run_type),
                    "run_after": dr.run_after,
                    "start_date": dr.start_date,
                    "end_date": dr.end_date,
                    "conf": conf,
                    "summary": summarize(summaries),
                    "summaries": summaries,
                })
                taken += 1
                if taken >= limit:
                    break
    runs.sort(key=lambda r: r["run_after"], reverse=True)
    return runs[:limit]


def table_view(cfg: Any, user: BaseUser, history_hours: float = 24.0) -> TableView:
    """Status, lag history and runs of one table; each part that fails says why and the rest still shows."""
    view = TableView(name=cfg.name, uri=cfg.uri)
    thresholds = getattr(cfg, "thresholds", None)
    view.limits = {key: limit for key, _, tkey in COLUMNS
                   if tkey and (limit := threshold(thresholds, tkey)) is not None}
    t0 = time.monotonic()
    try:
        status, snapshot_ts = table_status(cfg)
        view.summary = status
        view.regions = region_rows(status, getattr(cfg, "thresholds", None), snapshot_ts)
        view.indexes = index_rows(status, thresholds)
    except Exception as exc:  # shown on the page; the other tables still render
        log.warning("status of table %s (%s) failed: %s", cfg.name, cfg.uri, exc)
        view.error = f"status of table {cfg.name} at {cfg.uri} could not be read: {exc}"
    log.debug("status of %s in %.2fs", cfg.name, time.monotonic() - t0)
    if view.error is None:
        try:
            view.search = search_costs_of(cfg)
        except Exception as exc:  # a generation that cannot be opened: the status still shows
            log.warning("search costs of table %s (%s) failed: %s", cfg.name, cfg.uri, exc)
            view.notes.append(f"search costs unavailable: {exc}")
    try:
        view.history = history_points(cfg.name, datetime.now(UTC) - timedelta(hours=history_hours))
    except Exception as exc:
        view.notes.append(f"lag history unavailable: {exc}")
    try:
        view.runs = recent_runs(cfg.name, user)
    except Exception as exc:
        view.notes.append(f"maintenance runs unavailable: {exc}")
    return view
