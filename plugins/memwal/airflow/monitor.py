"""The lag monitor's checks: one table (`check_table_lag`), and one cycle over every configured table in one
task (`check_fleet`, what the `memwal_lag_monitor` DAG runs every few minutes).

Measure (`memwal status` + snapshot age + the table's health), emit the metrics (`memwal.airflow.metrics`),
record the history (`memwal.airflow.history`), hold the lag against the table's thresholds, and notify once
when a threshold is crossed and once when the table is back under (`memwal.airflow.alerts`, state kept across
runs). A table whose storage cannot be read counts as a breach (`table:unreachable`), so it alerts too.

Health on this path stays cheap: every check takes the manifest reading (`memwal.health`); the storage
reading (a listing of every object and a GC dry run over every retained version) is taken at most once per
$MEMWAL_HEALTH_STORAGE_INTERVAL_S (default 3600 s), kept in the lag asset's state store, and reused with its
`storage_measured_at` until then.

A cycle (`check_fleet`) checks each table exactly as `check_table_lag` does (the same metrics, history and
alerts), at most $MEMWAL_LAG_MONITOR_CONCURRENCY tables at once (default 8), adds each table's due-work probe
(`memwal.probe.probe_table`, its state kept in the lag asset's store: an unchanged table costs two listings;
not for a `fleet: true` table, which the fleet DAG probes)
and saves one row per table (`memwal.airflow.fleet_status`) for the page. A table that fails (storage error,
corrupt manifest, permissions, a bad tables-file entry, an alert not delivered) is its row's error and the
others are checked; the cycle then lists it as failed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from memwal.airflow import alerts, history
from memwal.airflow.metrics import emit_lag_metrics
from memwal.airflow.triggers.memwal import thresholds_of
from memwal.lag import breaches, measure

__all__ = ["CONCURRENCY_ENV", "STORAGE_INTERVAL_ENV", "check_configured_table", "check_fleet", "check_table_lag",
           "compaction_target", "concurrency", "configured_tables", "measure_table", "storage_interval_s"]

log = logging.getLogger(__name__)

STORAGE_INTERVAL_ENV = "MEMWAL_HEALTH_STORAGE_INTERVAL_S"
DEFAULT_STORAGE_INTERVAL_S = 3600.0
CONCURRENCY_ENV = "MEMWAL_LAG_MONITOR_CONCURRENCY"
DEFAULT_CONCURRENCY = 8


def storage_interval_s() -> float:
    """How old a kept storage reading may be before the lag monitor takes a new one, in seconds
    (`$MEMWAL_HEALTH_STORAGE_INTERVAL_S`, default 3600; 0: every check)."""
    raw = os.environ.get(STORAGE_INTERVAL_ENV) or ""
    try:
        value = float(raw) if raw.strip() else DEFAULT_STORAGE_INTERVAL_S
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"${STORAGE_INTERVAL_ENV} must be a number of seconds >= 0, not {raw!r}")
    return value


def compaction_target(cfg: Any) -> int | None:
    """The table's `compaction.target_rows_per_fragment` (None: compaction's default): the one target its
    small fragments are counted against, by the lag monitor and the page alike."""
    return getattr(getattr(cfg, "compaction", None), "target_rows_per_fragment", None)


def measure_table(cfg: Any, table: Any, *, storage: bool = False) -> dict[str, Any]:
    """`memwal.lag.measure` of a configured table with its health, counted against the table's own
    compaction policy; storage=True adds the storage reading taken now."""
    return measure(table, health=True, target_rows_per_fragment=compaction_target(cfg), storage=storage)


def _measure(cfg: Any, storage_reading: Callable[[Any], Mapping[str, Any] | None] | None = None,
             ) -> tuple[dict[str, Any], list[dict[str, Any]], str | None]:
    """(summary, breaches, error): an unreadable table gives an empty summary and one breach.
    storage_reading(table) gives the storage figures to add to the health (None: leave them out)."""
    from memwal.airflow.hooks.memwal import MemWalHook

    try:
        # one-line errors: missing table, no MemWAL, storage unreachable
        table = MemWalHook.for_table(cfg).table(cfg)
        summary = measure_table(cfg, table)
    except Exception as exc:
        error = " ".join(str(exc).split())[:500] or type(exc).__name__
        summary = {"table_uri": cfg.uri, "num_regions": 0, "regions": [], "error": error}
        found = [{"key": "table:unreachable", "region_id": None, "metric": "unreachable", "value": None,
                  "threshold": None, "message": f"table: lag not measured: {error}"}]
        return summary, found, error
    reading = storage_reading(table) if storage_reading is not None else None
    if reading:
        from memwal.health import STORAGE_KEYS

        summary["health"] = {**summary["health"], **{k: reading.get(k) for k in STORAGE_KEYS}}
    return summary, breaches(summary, thresholds_of(cfg)), None


def _storage_reading(cfg: Any, table: Any, at: datetime) -> dict[str, Any] | None:
    """The table's kept storage reading if it is of the same URI and younger than storage_interval_s(), else
    one taken now (and kept). A reading that fails is logged and the kept one (or none) is used: the lag check
    itself goes on."""
    from memwal.health import storage_health

    interval = storage_interval_s()
    kept = history.load_storage_health(cfg.name)
    if kept and kept.get("table_uri") != cfg.uri:
        kept = None  # the table was moved: its old figures say nothing about the new one
    age = _age_s(kept.get("storage_measured_at") if kept else None, at)
    if age is not None and 0 <= age < interval:
        return kept
    try:
        reading = {**storage_health(table).to_dict(), "storage_measured_at": at.isoformat(timespec="seconds"),
                   "table_uri": cfg.uri}
    except Exception as exc:  # the storage figures wait for the next check; the lag is still measured
        log.warning("table %s: storage health not read (%s: %s); %s", cfg.name, type(exc).__name__,
                    " ".join(str(exc).split())[:300], "keeping the last reading" if kept else "none kept")
        return kept
    history.save_storage_health(cfg.name, reading)
    return reading


def _age_s(iso: Any, at: datetime) -> float | None:
    """Seconds from an ISO-8601 time to `at` (None: no time, or one that does not parse)."""
    try:
        then = datetime.fromisoformat(iso)
    except (TypeError, ValueError):
        return None
    return (_utc(at) - _utc(then)).total_seconds()


def _utc(at: datetime) -> datetime:
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def configured_tables() -> list[str]:
    """Every table of the tables file (with the `memwal_tables` Variable applied), valid or not: a bad entry
    fails its own check (below), the others are still checked. A file that cannot be read at all fails
    the task without a retry (AirflowFailException: retrying cannot fix it)."""
    from memwal.airflow.config import config_errors_fail, load_tables_and_errors

    with config_errors_fail():
        good, bad = load_tables_and_errors()
    return sorted({*good, *bad})


def check_configured_table(name: str, context: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`check_table_lag` of a table by name, as the lag monitor's mapped task runs it. A bad entry in the
    tables file fails without a retry (AirflowFailException naming the table and key); a table whose lag
    cannot be measured fails with AirflowException (after alerting), which is retried."""
    from airflow.sdk.exceptions import AirflowException

    from memwal.airflow.config import config_errors_fail, get_table

    with config_errors_fail():
        cfg = get_table(name)
    result = check_table_lag(cfg, context=context)
    if result["error"]:
        raise AirflowException(f"table {name!r}: lag not measured: {result['error']}")
    return result


def check_table_lag(cfg: Any, *, notifiers: Sequence[Any] | None = None, context: Mapping[str, Any] | None = None,
                    at: datetime | None = None) -> dict[str, Any]:
    """Check one table; returns a small JSON-ready result (for XCom: no secrets, no per-region list).

    notifiers: None -> the table's configured ones (`alerts.notifiers_for`); a list replaces them.
    """
    at = at or datetime.now(UTC)
    summary, found, error = _measure(cfg, lambda table: _storage_reading(cfg, table, at))
    sent = [] if error else emit_lag_metrics(cfg.name, summary, len(found))
    history.record(cfg.name, {**summary, "breaches": found}, at)
    state = history.load_alert_state(cfg.name)
    alert, new_state = alerts.transition(cfg.name, found, state, at.isoformat(timespec="seconds"), summary)
    if alert is not None:
        chosen = alerts.notifiers_for(cfg) if notifiers is None else [alerts.build_notifier(n, cfg.name)
                                                                     for n in notifiers]
        if chosen:
            log.info("table %s: %s alert to %d notifier(s): %s", cfg.name, alert["state"], len(chosen), alert["text"])
        else:
            log.warning("table %s: %s alert, but no notifier is configured (create the memwal_alerts "
                        "connection or set alerts in the tables file): %s", cfg.name, alert["state"], alert["text"])
        alerts.send(alert, chosen, context)  # raises before the state advances: the next run sends it again
    history.save_alert_state(cfg.name, new_state)
    for b in found:
        log.warning("table %s: %s", cfg.name, b["message"])
    return {
        "table": cfg.name,
        "at": at.isoformat(timespec="seconds"),
        "error": error,
        "breaches": [b["message"] for b in found],
        "alert": alert["state"] if alert else None,
        "alert_since": new_state.get("since"),
        "metrics_sent": len(sent),
        **{k: summary.get(k) for k in ("num_regions", "unmerged_generations", "unmerged_rows", "unmerged_bytes",
                                       "oldest_unmerged_age_s", "max_index_lag_generations", "snapshot_age_s")},
        "health": {k: v for k, v in (summary.get("health") or {}).items() if k != "gc_limited_by"},
    }


def concurrency() -> int:
    """Tables a cycle checks at once (`$MEMWAL_LAG_MONITOR_CONCURRENCY`, default 8): each check is object-store
    requests in a row, so a few threads keep a 1,000-table cycle within minutes without a storm."""
    raw = os.environ.get(CONCURRENCY_ENV) or ""
    try:
        value = int(raw) if raw.strip() else DEFAULT_CONCURRENCY
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"${CONCURRENCY_ENV} must be a whole number of tables >= 1, not {raw!r}")
    return value


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:500] or type(exc).__name__


def _probe(cfg: Any) -> dict[str, Any]:
    """The table's due-work probe answer (`fleet_status.probe_answer`), from its kept state; a probe that cannot
    run at all is an error answer naming the table, never an exception."""
    from memwal.airflow import fleet_status
    from memwal.probe import ProbePolicy, ProbeState, probe_table

    try:
        kept = history.load_probe_state(cfg.name)
        previous = ProbeState.from_dict(kept) if kept else None
    except Exception as exc:  # an unreadable state: probe anew
        log.warning("table %s: probe state not read (%s); probing anew", cfg.name, _one_line(exc))
        previous = None
    try:
        from memwal.airflow.hooks.memwal import MemWalHook

        result = probe_table(cfg.uri, ProbePolicy(options=cfg.job_options()), previous,
                             storage_options=MemWalHook.for_table(cfg).storage_options)
    except Exception as exc:  # the policy or the connection: probe_table itself reports storage errors
        return {"status": "error", "due": [], "not_due": [], "error": f"table {cfg.name}: {_one_line(exc)}",
                "changed": None, "probed_at": datetime.now(UTC).timestamp()}
    try:
        history.save_probe_state(cfg.name, result.state.to_dict() if result.state else None)
    except Exception as exc:  # too large for the store, say: the next cycle reads the table anew
        log.warning("table %s: probe state not kept (%s)", cfg.name, _one_line(exc))
    return fleet_status.probe_answer(result)


def _check_in_cycle(cfg: Any, notifiers: Sequence[Any] | None, context: Mapping[str, Any] | None,
                    probe: bool) -> dict[str, Any]:
    """One table's row of a cycle: `check_table_lag` (an exception, e.g. an alert not delivered, is the row's
    error) and the probe's answer."""
    from memwal.airflow import fleet_status

    ctx = {**(context or {}), "memwal_table": cfg.name}
    try:
        result = check_table_lag(cfg, notifiers=notifiers, context=ctx)
    except Exception as exc:
        log.error("table %s: lag check failed: %s", cfg.name, _one_line(exc))
        result = {"table": cfg.name, "at": datetime.now(UTC).isoformat(timespec="seconds"),
                  "error": f"{type(exc).__name__}: {_one_line(exc)}", "breaches": [], "alert": None}
    # a `fleet: true` table is probed by the fleet DAG (its answer reaches the page as well): not twice a cycle
    answer = _probe(cfg) if probe and not getattr(cfg, "fleet", False) else None
    return fleet_status.row_of(result, cfg.uri, {"alerted": [], "since": result.get("alert_since")}, answer)


def check_fleet(*, notifiers: Sequence[Any] | None = None, context: Mapping[str, Any] | None = None,
                max_workers: int | None = None, probe: bool = True) -> dict[str, Any]:
    """One lag-monitor cycle over every configured table (the tables file with the `memwal_tables` Variable):
    each checked as `check_table_lag` checks it, at most `max_workers` (default `concurrency()`) at once, and
    probed (probe=False: not); the rows saved for the page (`fleet_status`, source lag_monitor). Returns a
    compact JSON-ready summary: tables, failed {table: error} (lag not measured or the check failed),
    probe_failed {table: error}, breached, alerts sent, due jobs counted, status_error (the rows not saved).
    A tables file that cannot be read at all raises AirflowFailException."""
    from concurrent.futures import ThreadPoolExecutor

    from memwal.airflow import fleet_status
    from memwal.airflow.config import config_errors_fail, load_tables_and_errors

    with config_errors_fail():
        good, bad = load_tables_and_errors()
    workers = max(1, min(max_workers or concurrency(), len(good) or 1))
    configs = [good[name] for name in sorted(good)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        rows = list(pool.map(lambda cfg: _check_in_cycle(cfg, notifiers, context, probe), configs))
    at = datetime.now(UTC)
    for name in sorted(bad):
        error = f"tables file: {_one_line(bad[name])}"
        log.error("table %s: not checked: %s", name, error)
        rows.append(fleet_status.row_of({"table": name, "at": at.isoformat(timespec="seconds"), "error": error}))
    try:
        stored, status_error = fleet_status.save(fleet_status.LAG_MONITOR, rows, at), None
    except Exception as exc:  # the gauges, history and alerts are out already; the page shows the last rows
        stored, status_error = 0, f"fleet status not saved: {_one_line(exc)}"
        log.error("lag monitor: %s", status_error)
    due: dict[str, int] = {}
    for row in rows:
        for job in (row.get("probe") or {}).get("due") or []:
            due[job["job"]] = due.get(job["job"], 0) + 1
    failed = {r["table"]: r["error"] for r in rows if r["error"]}
    # a configured table that is no table, or has no MemWAL, is as much an error here as a probe that failed
    probe_failed = {r["table"]: r["probe"]["error"] for r in rows if (r.get("probe") or {}).get("status") not in (
        None, "ok")}
    log.info("lag monitor: %d table(s) checked with %d thread(s), %d failed, %d behind; %d bytes of fleet status",
             len(rows), workers, len(failed), sum(bool(r["breaches"]) for r in rows), stored)
    return {"at": at.isoformat(timespec="seconds"), "tables": len(rows), "failed": failed,
            "probe_failed": probe_failed, "breached": sorted(r["table"] for r in rows if r["breaches"]),
            "alerts": {r["table"]: r["alert"] for r in rows if r["alert"]}, "due": due, "status_error": status_error}
