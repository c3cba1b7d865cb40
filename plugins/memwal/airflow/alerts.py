"""Lag alert state: alert once when a table crosses a threshold and once when it is back under.

The state (kept across runs in the lag asset's state store, `memwal.airflow.history`) is the set of
breach keys (`<region>:<metric>`, `table:snapshot_age_s`) that were already alerted. A run alerts
("firing") when a breach appears that was not alerted yet, and "resolved" when no breach is left; a run
whose breaches were all alerted already, or a partial recovery, sends nothing.

`notifiers_for(cfg)` builds the notifiers of a table from its `alerts` entry in the tables file: the
webhook notifier on `alerts.webhook_conn_id` (unset: `memwal_alerts` when that connection exists; "" or
false: no webhook) and each entry of `alerts.notifiers` (a dotted path to a BaseNotifier class or to a
callable/instance, or `{class: path, kwargs: {...}}`). A notifier is called like an Airflow callback,
with the task context plus `memwal_alert` (what `transition` returns).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, is_dataclass
from typing import Any

__all__ = [
    "ALERT_KEYS", "AlertDeliveryError", "alert_settings", "build_notifier", "notifiers_for", "send", "transition",
]

log = logging.getLogger(__name__)
Notifier = Callable[[Any], Any]


class AlertDeliveryError(RuntimeError):
    """A notifier failed; the alert state was not advanced, so the next monitor run sends it again."""


def transition(table: str, found: Sequence[Mapping[str, Any]], state: Mapping[str, Any], at: str,
               summary: Mapping[str, Any] | None = None) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(alert to send or None, new state) for this run's breaches given the previous state."""
    summary = summary or {}
    alerted = set(state.get("alerted", []))
    current = {b["key"] for b in found}
    new = [b for b in found if b["key"] not in alerted]
    since = (state.get("since") or at) if current else None
    alert = None
    if new:
        text = f"[FIRING] MemWAL table {table} is behind: " + "; ".join(b["message"] for b in found)
        alert = {"state": "firing", "new_breaches": [dict(b) for b in new], "since": since}
    elif alerted and not current:
        text = f"[RESOLVED] MemWAL table {table} is back within its lag thresholds"
        alert = {"state": "resolved", "new_breaches": [], "since": state.get("since")}
    if alert is not None:
        alert.update(
            table=table, at=at, text=text, breaches=[dict(b) for b in found],
            **{k: summary.get(k) for k in ("table_uri", "unmerged_generations", "unmerged_bytes",
                                           "oldest_unmerged_age_s", "max_index_lag_generations", "snapshot_age_s")},
        )
    # keys stay alerted while breached (no repeat); keys that recovered are forgotten (a new crossing alerts)
    new_state = {"alerted": sorted(current), "since": since,
                 "last_alert": (alert or {}).get("state", state.get("last_alert")),
                 "last_alert_at": at if alert else state.get("last_alert_at")}
    return alert, new_state


ALERT_KEYS = ("webhook_conn_id", "notifiers")


def alert_settings(cfg: Any) -> dict[str, Any]:
    """The table's `alerts` settings (mapping or dataclass; absent: defaults); ValueError naming the table
    and the key for an unknown key or a wrong type."""
    raw = getattr(cfg, "alerts", None)
    if raw is None:
        return {}
    settings = asdict(raw) if is_dataclass(raw) else dict(raw)
    name = getattr(cfg, "name", "?")
    for key in settings:
        if key not in ALERT_KEYS:
            raise ValueError(f"table {name!r}: unknown key alerts.{key} (known: {', '.join(ALERT_KEYS)})")
    conn_id = settings.get("webhook_conn_id")
    if conn_id not in (None, False) and not isinstance(conn_id, str):
        raise ValueError(f"table {name!r}: alerts.webhook_conn_id must be a connection id, \"\" or false")
    notifiers = settings.get("notifiers")
    if notifiers is not None and not isinstance(notifiers, list | tuple):
        raise ValueError(f"table {name!r}: alerts.notifiers must be a list of dotted paths or {{class, kwargs}}")
    return settings


def _import(path: str, table: str) -> Any:
    module, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"table {table!r}: alerts.notifiers entry {path!r} cannot be imported: {exc}") from None


def build_notifier(entry: Any, table: str) -> Notifier:
    """A notifier from a config entry: dotted path (class, factory or instance) or {class, kwargs}."""
    if callable(entry) and not isinstance(entry, type):
        return entry
    kwargs: dict[str, Any] = {}
    if isinstance(entry, Mapping):
        path, kwargs = entry.get("class"), dict(entry.get("kwargs") or {})
    else:
        path = entry
    if not isinstance(path, str):
        raise ValueError(f"table {table!r}: alerts.notifiers entry {entry!r} is not a dotted path or "
                         "{class: dotted.path, kwargs: {...}}")
    obj = _import(path, table)
    if isinstance(obj, type) or kwargs:
        obj = obj(**kwargs)
    if not callable(obj):
        raise ValueError(f"table {table!r}: alerts.notifiers entry {path!r} is not callable")
    return obj


def _connection_exists(conn_id: str) -> bool:
    from airflow.sdk import BaseHook

    try:
        BaseHook.get_connection(conn_id)
    except Exception:  # AirflowNotFoundException, or no way to reach connections at all
        return False
    return True


def notifiers_for(cfg: Any, extra: Sequence[Any] = ()) -> list[Notifier]:
    """The table's notifiers (webhook + configured ones) plus `extra` (notifiers or config entries)."""
    from memwal.airflow.notifications.webhook import DEFAULT_WEBHOOK_CONN_ID, MemWalWebhookNotifier

    settings = alert_settings(cfg)
    out: list[Notifier] = []
    conn_id = settings.get("webhook_conn_id")
    if conn_id is None:  # not set: the default connection, when it exists
        conn_id = DEFAULT_WEBHOOK_CONN_ID if _connection_exists(DEFAULT_WEBHOOK_CONN_ID) else None
        if conn_id is None:
            log.info("table %s: no %r connection and no alerts.webhook_conn_id: no webhook alerts",
                     cfg.name, DEFAULT_WEBHOOK_CONN_ID)
    if conn_id:  # set explicitly (a missing connection then fails the alert loudly); "" or false: none
        out.append(MemWalWebhookNotifier(webhook_conn_id=conn_id))
    out += [build_notifier(e, cfg.name) for e in [*(settings.get("notifiers") or []), *extra]]
    return out


def send(alert: Mapping[str, Any], notifiers: Sequence[Notifier], context: Mapping[str, Any] | None) -> int:
    """Call every notifier with the context plus `memwal_alert`; AlertDeliveryError if any failed."""
    failures = []
    for notifier in notifiers:
        ctx = dict(context or {})
        ctx["memwal_alert"] = dict(alert)
        try:
            notifier(ctx)
        except Exception as exc:
            name = type(notifier).__name__
            log.error("table %s: %s notifier failed: %s", alert.get("table"), name, exc)
            failures.append(f"{name}: {exc}")
    if failures:
        raise AlertDeliveryError(f"table {alert.get('table')}: {alert.get('state')} alert not delivered by "
                                 f"{len(failures)} of {len(notifiers)} notifiers ({'; '.join(failures)})")
    return len(notifiers)
