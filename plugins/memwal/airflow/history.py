"""Lag history and alert state of each table, kept in the Airflow metadata DB with bounded retention.

Where: the state store of the table's lag asset (`memwal_lag__<table>`, `memwal.airflow.assets`), the
key/value store Airflow 3.3 keeps per asset in its metadata DB (table `asset_state_store`, PostgreSQL or
SQLite; it survives restarts and goes away with the asset). Why not a table of our own: Airflow 3 blocks
the ORM inside tasks (workers talk to the Execution API, not the DB), so the lag monitor task could not
write it; the asset state store is reachable from a task (Execution API), from the triggerer and from the
api-server (the UI page reads it), and honours a custom `[state_store] backend`.

Layout under the lag asset: `lag_history/index` lists the buckets ([key, first sample time, samples]);
each bucket `lag_history/<first sample time>` holds up to BUCKET_SAMPLES samples and BUCKET_BYTES (so no
value grows past the store's `max_value_storage_bytes`, 64 KiB by default); a sample keeps the per-region
detail of the MAX_REGIONS_PER_SAMPLE regions furthest behind (the table-wide values cover all regions).
`lag_alert_state` is the alert state; `health_storage` the table's last storage health reading (a listing and
a GC dry run, `memwal.health.StorageHealth`), which the lag monitor reuses until it is due again; `probe_state`
the due-work probe's state (`memwal.probe.ProbeState`), so the next cycle's probe of an unchanged table reads
nothing but its two listings. Retention:
samples older than `retention_days` and any beyond `max_samples` (whole buckets, oldest first) are deleted on
record.

A sample (what `read` returns, oldest first):
    {"at": ISO-8601 UTC, "table", "table_version", "num_regions", "unmerged_generations", "unmerged_rows",
     "unmerged_bytes", "oldest_unmerged_age_s", "max_index_lag_generations", "snapshot_age_s",
     "breaches": [breach message, ...],
     "regions": {region_id: {"unmerged_generations", "unmerged_rows", "unmerged_bytes",
                             "oldest_unmerged_age_s", "index_lag_generations", "merged_generation",
                             "current_generation", "error"}}}
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

__all__ = [
    "BUCKET_BYTES",
    "BUCKET_SAMPLES",
    "DEFAULT_MAX_SAMPLES",
    "DEFAULT_RETENTION_DAYS",
    "MAX_REGIONS_PER_SAMPLE",
    "HistoryError",
    "load_alert_state",
    "load_probe_state",
    "load_storage_health",
    "read",
    "record",
    "save_alert_state",
    "save_probe_state",
    "save_storage_health",
]

DEFAULT_RETENTION_DAYS = float(os.environ.get("MEMWAL_LAG_HISTORY_DAYS", "7"))
DEFAULT_MAX_SAMPLES = int(os.environ.get("MEMWAL_LAG_HISTORY_MAX_SAMPLES", "5000"))
BUCKET_SAMPLES = 12
MAX_REGIONS_PER_SAMPLE = 25  # per-region detail kept per sample (keeps a bucket near the store's 64 KiB)
BUCKET_BYTES = 48 * 1024  # a bucket is closed early when it would grow past this
INDEX_KEY = "lag_history/index"
ALERT_KEY = "lag_alert_state"
STORAGE_HEALTH_KEY = "health_storage"
PROBE_STATE_KEY = "probe_state"
_TABLE_KEYS = ("table_version", "num_regions", "unmerged_generations", "unmerged_rows", "unmerged_bytes",
               "oldest_unmerged_age_s", "max_index_lag_generations", "snapshot_age_s")
_REGION_KEYS = ("unmerged_generations", "unmerged_rows", "unmerged_bytes", "oldest_unmerged_age_s",
                "index_lag_generations", "merged_generation", "current_generation", "error")


class HistoryError(RuntimeError):
    """The lag history could not be stored: the table's lag asset is not registered yet (let the DAG
    processor parse the MemWAL DAGs once), or the metadata DB is unreachable."""


class _Store(Protocol):
    def get(self, key: str) -> Any: ...
    def set(self, key: str, value: Any) -> None: ...
    def delete(self, key: str) -> None: ...


class _TaskSdkStore:
    """Inside a task (or `dag.test()`): the asset state store through the Execution API."""

    def __init__(self, asset_name: str):
        from airflow.sdk.execution_time.context import AssetStateStoreAccessor

        self._acc = AssetStateStoreAccessor(name=asset_name)
        self.asset_name = asset_name

    def get(self, key: str) -> Any:
        try:
            return self._acc.get(key)
        except Exception as exc:
            if "not found" in str(exc).lower() and "asset" in str(exc).lower():
                return None
            raise

    def set(self, key: str, value: Any) -> None:
        try:
            self._acc.set(key, value)
        except Exception as exc:
            raise HistoryError(f"lag asset {self.asset_name!r}: cannot store {key!r}: {exc}") from exc

    def delete(self, key: str) -> None:
        self._acc.delete(key)


class _MetadataDbStore:
    """Outside a task (the api-server, the CLI, tests): Airflow's state backend over the metadata DB."""

    def __init__(self, asset_name: str):
        self.asset_name = asset_name
        self._asset_id: int | None = None

    def _scope(self, required: bool) -> Any:
        from airflow._shared.state import AssetScope
        from airflow.models.asset import AssetModel
        from airflow.utils.session import create_session
        from sqlalchemy import select

        if self._asset_id is None:
            with create_session() as session:
                self._asset_id = session.scalar(
                    select(AssetModel.id).where(AssetModel.name == self.asset_name, AssetModel.active.has()))
        if self._asset_id is None:
            if required:
                raise HistoryError(f"lag asset {self.asset_name!r} is not registered in the metadata DB: the "
                                   "MemWAL DAGs must have been parsed by the DAG processor first")
            return None
        return AssetScope(asset_id=self._asset_id)

    def get(self, key: str) -> Any:
        from airflow.state import get_state_backend

        scope = self._scope(required=False)
        if scope is None:
            return None
        raw = get_state_backend().get(scope, key)
        return None if raw is None else json.loads(raw)

    def set(self, key: str, value: Any) -> None:
        from airflow.state import get_state_backend

        get_state_backend().set(self._scope(required=True), key, json.dumps(value))

    def delete(self, key: str) -> None:
        from airflow.state import get_state_backend

        scope = self._scope(required=False)
        if scope is not None:
            get_state_backend().delete(scope, key)


def in_task_sdk() -> bool:
    try:
        from airflow.sdk.execution_time import task_runner
    except ImportError:
        return False
    return getattr(task_runner, "SUPERVISOR_COMMS", None) is not None


def _store(table: str) -> _Store:
    from memwal.airflow.assets import lag_asset_name

    name = lag_asset_name(table)
    return _TaskSdkStore(name) if in_task_sdk() else _MetadataDbStore(name)


def _utc(at: datetime) -> datetime:
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def _iso(at: datetime) -> str:
    return _utc(at).isoformat(timespec="milliseconds")


def sample_of(table: str, status_summary: Mapping[str, Any], at: datetime) -> dict[str, Any]:
    """The compact sample kept for one measurement (see the module docstring): the table-wide values and
    the MAX_REGIONS_PER_SAMPLE regions furthest behind (unreadable ones first)."""
    regions = sorted(status_summary.get("regions", []), key=lambda r: (
        not r.get("error"), -(r.get("unmerged_generations") or 0), -(r.get("index_lag_generations") or 0)))
    return {
        "at": _iso(at),
        "table": table,
        **{k: status_summary.get(k) for k in _TABLE_KEYS},
        "breaches": [b["message"] if isinstance(b, Mapping) else str(b) for b in status_summary.get("breaches", [])],
        "regions": {r["region_id"]: {k: r.get(k) for k in _REGION_KEYS} for r in regions[:MAX_REGIONS_PER_SAMPLE]},
    }


def record(table: str, status_summary: Mapping[str, Any], at: datetime, *,
           retention_days: float | None = None, max_samples: int | None = None) -> dict[str, Any]:
    """Append one measurement (a `memwal status` summary, optionally with `snapshot_age_s` and `breaches`)
    to the table's history, then drop what is past retention. Returns the stored sample."""
    retention_days = DEFAULT_RETENTION_DAYS if retention_days is None else retention_days
    max_samples = DEFAULT_MAX_SAMPLES if max_samples is None else max_samples
    if max_samples < 1 or retention_days <= 0:
        raise ValueError(f"table {table!r}: history retention must keep something "
                         f"(retention_days={retention_days}, max_samples={max_samples})")
    store = _store(table)
    sample = sample_of(table, status_summary, at)
    index: list[list[Any]] = store.get(INDEX_KEY) or []
    bucket = (store.get(index[-1][0]) or []) if index and index[-1][2] < BUCKET_SAMPLES else []
    if bucket and index[-1][1] <= sample["at"] and len(json.dumps([*bucket, sample])) <= BUCKET_BYTES:
        key = index[-1][0]
        bucket.append(sample)
        index[-1][2] = len(bucket)
    else:
        key = f"lag_history/{sample['at']}"
        bucket = [sample]
        index.append([key, sample["at"], 1])
    store.set(key, bucket)
    cutoff = _iso(_utc(at) - timedelta(days=retention_days))
    # a bucket is past retention when the next one starts before the cutoff (all its samples are older)
    while len(index) > 1 and (index[1][1] < cutoff or sum(b[2] for b in index[1:]) >= max_samples):
        store.delete(index.pop(0)[0])
    store.set(INDEX_KEY, index)
    return sample


def read(table: str, since: datetime) -> list[dict[str, Any]]:
    """Samples of the table at or after `since`, oldest first ([] when nothing was recorded)."""
    store = _store(table)
    index: list[list[Any]] = store.get(INDEX_KEY) or []
    start = _iso(since)
    out: list[dict[str, Any]] = []
    for i, (key, _first, _n) in enumerate(index):
        if i + 1 < len(index) and index[i + 1][1] < start:
            continue
        out += [s for s in (store.get(key) or []) if s["at"] >= start]
    return out


def load_alert_state(table: str) -> dict[str, Any]:
    """The table's alert state ({} before the first run)."""
    return dict(_store(table).get(ALERT_KEY) or {})


def save_alert_state(table: str, state: Mapping[str, Any]) -> None:
    _store(table).set(ALERT_KEY, dict(state))


def load_storage_health(table: str) -> dict[str, Any] | None:
    """The table's last storage health reading (None before the first)."""
    value = _store(table).get(STORAGE_HEALTH_KEY)
    return dict(value) if isinstance(value, Mapping) else None


def save_storage_health(table: str, reading: Mapping[str, Any]) -> None:
    _store(table).set(STORAGE_HEALTH_KEY, dict(reading))


def load_probe_state(table: str) -> dict[str, Any] | None:
    """The table's last due-work probe state (`memwal.probe.ProbeState.to_dict()`; None before the first)."""
    value = _store(table).get(PROBE_STATE_KEY)
    return dict(value) if isinstance(value, Mapping) else None


def save_probe_state(table: str, state: Mapping[str, Any] | None) -> None:
    """Keep the probe state for the next cycle (None: forget it, the next probe reads the table anew)."""
    if state is None:
        _store(table).delete(PROBE_STATE_KEY)
    else:
        _store(table).set(PROBE_STATE_KEY, dict(state))
