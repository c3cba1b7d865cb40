"""Why a region cannot flush: the writer's record of its last failed flush, for status, the page and alerts.

A writer that cannot flush keeps every row in its MemTable and its WAL, so nothing is lost, but the region's
lag only grows; without this record an operator sees lag and not its cause. The record is ours (Lance core
neither writes nor reads it): `_mem_wal/{region}/flush_failure.json`, written when a flush fails and removed by
the next flush that commits. Writing it is best effort: it must never hide the flush's own error.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from memwal import naming
from memwal.errors import one_line
from memwal.storage import ObjectStore

__all__ = ["clear_flush_failure", "describe", "read_flush_failure", "record_flush_failure"]

log = logging.getLogger(__name__)


def record_flush_failure(store: ObjectStore, region_id: str, *, writer_epoch: int, generation: int,
                         memtable_rows: int, error: BaseException, previous: dict | None = None) -> dict:
    """Write (replace) the region's record; returns it. `previous`: this writer's last record, for the count."""
    record = {
        "region_id": region_id,
        "writer_epoch": writer_epoch,
        "generation": generation,
        "memtable_rows": memtable_rows,
        "error": one_line(error),
        "error_type": type(error).__name__,
        "first_failed_at": (previous or {}).get("first_failed_at", time.time()),
        "last_failed_at": time.time(),
        "attempts": (previous or {}).get("attempts", 0) + 1,
    }
    try:
        store.put(naming.flush_failure_path(region_id), json.dumps(record).encode())
    except Exception:  # the flush's error is what the caller must see
        log.warning("region %s: could not record the flush failure", region_id, exc_info=True)
    return record


def clear_flush_failure(store: ObjectStore, region_id: str) -> None:
    """Remove the record after a flush committed (deleting a missing record is not an error)."""
    try:
        store.delete(naming.flush_failure_path(region_id))
    except Exception:
        log.warning("region %s: could not remove %s", region_id, naming.FLUSH_FAILURE_FILE, exc_info=True)


def read_flush_failure(store: ObjectStore, region_id: str) -> dict[str, Any] | None:
    """The region's record, or None when its last flush committed (or nothing was ever recorded)."""
    try:
        data = store.get(naming.flush_failure_path(region_id))
    except FileNotFoundError:
        return None
    try:
        record = json.loads(data)
    except ValueError:
        return {"error": f"{naming.FLUSH_FAILURE_FILE} is not JSON", "attempts": 0}
    return record if isinstance(record, dict) else None


def describe(record: dict[str, Any], now: float | None = None) -> str:
    """One line for status, the page and alerts: since when, how often, and the error."""
    now = time.time() if now is None else now
    since = record.get("first_failed_at")
    age = f" for {max(0.0, now - since):.0f} s" if isinstance(since, int | float) else ""
    rows = record.get("memtable_rows")
    held = f", {rows} rows held in the MemTable and WAL" if rows is not None else ""
    return (f"cannot flush generation {record.get('generation', '?')}{age} ({record.get('attempts', '?')} "
            f"attempts{held}): {record.get('error', 'unknown error')}")
