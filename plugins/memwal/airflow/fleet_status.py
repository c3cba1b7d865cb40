"""The fleet's last cycle: one compact row per table (its lag figures, breaches and alert state, the probe's
answer: what is due and why, or the error that stopped it), kept as one JSON object per source in an Airflow
Variable that every cycle overwrites. The page reads it (one metadata-DB read) instead of opening 1,000 tables.

Sources: `lag_monitor` (the `memwal_lag_monitor` DAG, every cycle, every configured table) and `fleet_probe`
(a fleet DAG's probe sweep may save its answers the same way, `save(FLEET_PROBE, rows, at)`; a table in both
shows the newer probe answer). Variable `memwal_fleet_status__<source>`: {"at": ISO-8601 UTC, "source",
"tables": {name: row}}. Why a Variable: overwritten in place, so the metadata DB does not grow with cycles
(about 0.6 KB a table: 0.6 MB at 1,000 tables; MEDIUMTEXT on MySQL), readable from a task (Execution API)
and from the api-server alike. A row (`row_of`):

    {"table", "uri", "at", "error", "breaches": [message], "alert": firing|resolved|None,
     "alert_state": {"alerted": [key], "since"}, "num_regions", "unmerged_generations", "unmerged_rows",
     "unmerged_bytes", "oldest_unmerged_age_s", "max_index_lag_generations", "snapshot_age_s",
     "probe": {"status", "due": [{"job", "reason"}], "not_due": [job], "error", "changed", "probed_at"} | None}
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

__all__ = ["FLEET_PROBE", "LAG_MONITOR", "VARIABLE_PREFIX", "load", "load_rows", "probe_answer", "row_of", "save"]

VARIABLE_PREFIX = "memwal_fleet_status__"
LAG_MONITOR = "lag_monitor"
FLEET_PROBE = "fleet_probe"
SOURCES = (LAG_MONITOR, FLEET_PROBE)
_LAG_KEYS = ("num_regions", "unmerged_generations", "unmerged_rows", "unmerged_bytes", "oldest_unmerged_age_s",
             "max_index_lag_generations", "snapshot_age_s")
_REASON_CHARS = 300  # one line per due job is enough for the overview; the per-table view has the rest


class _Backend(Protocol):
    def get(self, key: str) -> str | None: ...
    def set(self, key: str, value: str) -> None: ...


class _TaskSdkVariables:
    """Inside a task: Variables through the Execution API."""

    def get(self, key: str) -> str | None:
        from airflow.sdk import Variable

        return Variable.get(key, default=None)

    def set(self, key: str, value: str) -> None:
        from airflow.sdk import Variable

        Variable.set(key, value, description="MemWAL: the last cycle's per-table rows (memwal.airflow.fleet_status)")


class _MetadataDbVariables:
    """Outside a task (the api-server, the CLI): Variables in the metadata DB."""

    def get(self, key: str) -> str | None:
        from airflow.models.variable import Variable

        return Variable.get(key, default_var=None)

    def set(self, key: str, value: str) -> None:
        from airflow.models.variable import Variable

        Variable.set(key, value)


def _backend() -> _Backend:
    from memwal.airflow.history import in_task_sdk

    return _TaskSdkVariables() if in_task_sdk() else _MetadataDbVariables()


def probe_answer(result: Any) -> dict[str, Any]:
    """The overview's part of a `memwal.probe.ProbeResult`: status, each due job with its reason, the jobs not
    due, the error (storage, corrupt manifest, permissions) and whether the table changed since the last probe."""
    from memwal.probe import JOB_ORDER

    due = [{"job": d.job, "reason": " ".join(str(d.reason).split())[:_REASON_CHARS]} for d in result.due]
    return {"status": result.status, "due": due, "not_due": [j for j in JOB_ORDER if j not in {d["job"] for d in due}],
            "error": result.error, "changed": result.changed, "probed_at": result.probed_at}


def row_of(check: Mapping[str, Any], uri: str | None = None, alert_state: Mapping[str, Any] | None = None,
           probe: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One table's row from the lag monitor's check result (`memwal.airflow.monitor.check_table_lag`)."""
    state = alert_state or {}
    return {"table": check["table"], "uri": uri, "at": check.get("at"), "error": check.get("error"),
            "breaches": list(check.get("breaches") or []), "alert": check.get("alert"),
            "alert_state": {"alerted": list(state.get("alerted") or []), "since": state.get("since")},
            **{k: check.get(k) for k in _LAG_KEYS}, "probe": dict(probe) if probe is not None else None}


def save(source: str, rows: Iterable[Mapping[str, Any]], at: datetime) -> int:
    """Overwrite the source's last cycle with these rows; returns the bytes stored."""
    if source not in SOURCES:
        raise ValueError(f"fleet status source {source!r} is not one of {', '.join(SOURCES)}")
    at = at if at.tzinfo else at.replace(tzinfo=UTC)
    value = json.dumps({"at": at.astimezone(UTC).isoformat(timespec="seconds"), "source": source,
                        "tables": {r["table"]: dict(r) for r in rows}}, default=str, separators=(",", ":"))
    _backend().set(VARIABLE_PREFIX + source, value)
    return len(value)


def load(source: str) -> dict[str, Any] | None:
    """The source's last cycle ({"at", "source", "tables"}), None before its first."""
    raw = _backend().get(VARIABLE_PREFIX + source)
    if raw in (None, ""):
        return None
    value = json.loads(raw) if isinstance(raw, str) else raw
    return value if isinstance(value, dict) and isinstance(value.get("tables"), dict) else None


def load_rows() -> tuple[dict[str, dict[str, Any]], str | None]:
    """Every table's row, the lag monitor's with the newer probe answer of either source, and the time of the
    lag monitor's last cycle (None: it has not run yet)."""
    lag = load(LAG_MONITOR) or {"tables": {}, "at": None}
    probed = (load(FLEET_PROBE) or {"tables": {}})["tables"]
    rows = {name: dict(row) for name, row in lag["tables"].items()}
    for name, other in probed.items():
        answer = other.get("probe")
        row = rows.setdefault(name, {**other, "from_probe_only": True})
        mine = row.get("probe")
        if answer and (not mine or (answer.get("probed_at") or 0) > (mine.get("probed_at") or 0)):
            row["probe"] = answer
    return rows, lag.get("at")
