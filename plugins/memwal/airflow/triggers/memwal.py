"""Triggers that watch a MemWAL table's lag from the triggerer.

- `MemWalLagEventTrigger` (a `BaseEventTrigger`, for the lag asset's `AssetWatcher`): polls the table and
  fires an event each time its lag crosses a threshold (no breach -> breach), so the table's maintenance
  DAG starts when the table falls behind. It keeps polling while the table stays behind without firing
  again; once the table is back under, the next crossing fires again.
- `MemWalLagTrigger` (a plain trigger, for the deferrable `MemWalLagSensor`): polls until the table is
  within its thresholds (or, with `wait_for="breached"`, until a threshold is breached) and fires once.

Kwargs hold the table's name, URI, connection id and thresholds, never credentials (they are stored in the
metadata DB): the connection is resolved inside `run()` with the async connection API of the triggerer,
and the status is read in a thread so the triggerer's event loop never blocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime
from typing import Any

from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

from memwal.lag import breaches, measure, validate_thresholds

__all__ = ["MemWalLagEventTrigger", "MemWalLagTrigger", "lag_event_payload", "resolve_connection", "thresholds_of"]

WAIT_FOR = ("within", "breached")


def thresholds_of(cfg: Any) -> dict[str, float]:
    """A table config's thresholds as a plain dict (None values dropped), JSON-ready for trigger kwargs."""
    t = getattr(cfg, "thresholds", None)
    if t is None:
        return {}
    raw = asdict(t) if is_dataclass(t) else dict(t) if isinstance(t, Mapping) else {}
    return validate_thresholds(raw, f"table {getattr(cfg, 'name', '?')!r} thresholds")


async def resolve_connection(conn_id: str | None) -> Any:
    """The table's `memwal` connection through the async connection API (triggerer-safe), or None."""
    if not conn_id:
        return None
    from airflow.sdk import BaseHook

    return await BaseHook.aget_connection(conn_id)


def _table_with(conn: Any, uri: str) -> Any:
    """The table's handle with the storage options of its connection (None: no connection)."""
    from memwal.airflow.hooks.memwal import MemWalHook
    from memwal.table import MemWalTable

    return MemWalTable(uri, MemWalHook.storage_options_from(conn) if conn is not None else None)


def lag_event_payload(table: str, summary: Mapping[str, Any], found: list[dict[str, Any]]) -> dict[str, Any]:
    """What an event carries: the table, when, its breaches and the table-wide lag (no per-region list)."""
    keys = ("table_uri", "table_version", "num_regions", "unmerged_generations", "unmerged_rows", "unmerged_bytes",
            "oldest_unmerged_age_s", "max_index_lag_generations", "snapshot_age_s")
    return {
        "table": table,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "breached": bool(found),
        "breaches": found,
        **{k: summary.get(k) for k in keys},
    }


class _LagPoller:
    """What both triggers share: their kwargs and one measurement off the event loop."""

    table: str
    table_uri: str
    conn_id: str | None
    thresholds: dict[str, float]
    poll_interval_s: float

    def _init(self, table: str, table_uri: str, conn_id: str | None, thresholds: Mapping[str, Any] | None,
              poll_interval_s: float) -> None:
        self.table = table
        self.table_uri = table_uri
        self.conn_id = conn_id
        self.thresholds = validate_thresholds(thresholds, f"table {table!r} thresholds")
        if poll_interval_s <= 0:
            raise ValueError(f"table {table!r}: poll_interval_s must be > 0, got {poll_interval_s!r}")
        self.poll_interval_s = float(poll_interval_s)

    async def _poll(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """One measurement; the table's handle is kept between polls (each poll refreshes it) and dropped
        after a failure, so the next poll resolves the connection and opens the table again."""
        if getattr(self, "_handle", None) is None:
            self._handle = _table_with(await resolve_connection(self.conn_id), self.table_uri)
        try:
            summary = await asyncio.to_thread(measure, self._handle)
        except Exception:
            self._handle = None
            raise
        return summary, breaches(summary, self.thresholds)


class MemWalLagEventTrigger(_LagPoller, BaseEventTrigger):
    """Fires each time the table's lag crosses a threshold (for the lag asset's AssetWatcher)."""

    def __init__(self, *, table: str, table_uri: str, conn_id: str | None = None,
                 thresholds: Mapping[str, Any] | None = None, poll_interval_s: float = 60.0) -> None:
        super().__init__()
        self._init(table, table_uri, conn_id, thresholds, poll_interval_s)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"table": self.table, "table_uri": self.table_uri, "conn_id": self.conn_id,
             "thresholds": dict(self.thresholds), "poll_interval_s": self.poll_interval_s},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        behind = False
        while True:
            try:
                summary, found = await self._poll()
            except Exception as exc:  # storage down, table gone: say so and keep watching
                self.log.warning("table %s: lag not measured (%s: %s); retrying in %gs",
                                 self.table, type(exc).__name__, exc, self.poll_interval_s)
            else:
                if found and not behind:
                    self.log.info("table %s crossed a lag threshold: %s", self.table,
                                  "; ".join(b["message"] for b in found))
                    yield TriggerEvent(lag_event_payload(self.table, summary, found))
                elif behind and not found:
                    self.log.info("table %s is back within its lag thresholds", self.table)
                behind = bool(found)
            await asyncio.sleep(self.poll_interval_s)


class MemWalLagTrigger(_LagPoller, BaseTrigger):
    """Fires once when the table is within its thresholds (wait_for="within") or breaches one ("breached")."""

    def __init__(self, *, table: str, table_uri: str, conn_id: str | None = None,
                 thresholds: Mapping[str, Any] | None = None, poll_interval_s: float = 60.0,
                 wait_for: str = "within") -> None:
        super().__init__()
        self._init(table, table_uri, conn_id, thresholds, poll_interval_s)
        if wait_for not in WAIT_FOR:
            raise ValueError(f"table {table!r}: wait_for must be one of {', '.join(WAIT_FOR)}, got {wait_for!r}")
        self.wait_for = wait_for

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"table": self.table, "table_uri": self.table_uri, "conn_id": self.conn_id,
             "thresholds": dict(self.thresholds), "poll_interval_s": self.poll_interval_s,
             "wait_for": self.wait_for},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                summary, found = await self._poll()
            except Exception as exc:
                yield TriggerEvent({"status": "error", "table": self.table,
                                    "message": f"table {self.table}: lag not measured: {type(exc).__name__}: {exc}"})
                return
            if bool(found) == (self.wait_for == "breached"):
                yield TriggerEvent({"status": "success", **lag_event_payload(self.table, summary, found)})
                return
            await asyncio.sleep(self.poll_interval_s)
