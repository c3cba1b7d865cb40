"""One lag check of one table, as the `memwal_lag_monitor` DAG runs it every few minutes.

Measure (`memwal status` + snapshot age), emit the metrics (`memwal.airflow.metrics`), record the history
(`memwal.airflow.history`), hold the lag against the table's thresholds, and notify once when a threshold
is crossed and once when the table is back under (`memwal.airflow.alerts`, state kept across runs).
A table whose storage cannot be read counts as a breach (`table:unreachable`), so it alerts too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from memwal.airflow import alerts, history
from memwal.airflow.metrics import emit_lag_metrics
from memwal.airflow.triggers.memwal import thresholds_of
from memwal.lag import breaches, measure

__all__ = ["check_configured_table", "check_table_lag", "configured_tables"]

log = logging.getLogger(__name__)


def _measure(cfg: Any) -> tuple[dict[str, Any], list[dict[str, Any]], str | None]:
    """(summary, breaches, error): an unreadable table gives an empty summary and one breach."""
    from memwal.airflow.hooks.memwal import MemWalHook

    try:
        # one-line errors: missing table, no MemWAL, storage unreachable
        summary = measure(MemWalHook.for_table(cfg).table(cfg), health=True)
    except Exception as exc:
        error = " ".join(str(exc).split())[:500] or type(exc).__name__
        summary = {"table_uri": cfg.uri, "num_regions": 0, "regions": [], "error": error}
        found = [{"key": "table:unreachable", "region_id": None, "metric": "unreachable", "value": None,
                  "threshold": None, "message": f"table: lag not measured: {error}"}]
        return summary, found, error
    return summary, breaches(summary, thresholds_of(cfg)), None


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
    summary, found, error = _measure(cfg)
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
        "metrics_sent": len(sent),
        **{k: summary.get(k) for k in ("num_regions", "unmerged_generations", "unmerged_rows", "unmerged_bytes",
                                       "oldest_unmerged_age_s", "max_index_lag_generations", "snapshot_age_s")},
        "health": {k: v for k, v in (summary.get("health") or {}).items() if k != "gc_limited_by"},
    }
