"""Lag of a MemWAL table: one measurement, the thresholds, the breaches (the one definition of "behind").

`measure` is `memwal.status` (per region: unmerged generations, rows, bytes, age of the oldest unmerged
generation, index lag) plus the age of the MemWAL index snapshot (a table-wide value) and, with
`health=True`, the table's health (`memwal.health`: fragments, deleted rows, versions, bytes), and always
each index's health (`memwal.index_health`: segments, unindexed rows). `breaches` holds a
measurement against a table's thresholds; `memwal status` (exit 4), the Airflow lag monitor, event trigger
and sensor all use it, so they agree on what "behind" means. A health value absent from a measurement
(None: e.g. a storage figure not read this time) is not held against its threshold.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memwal.table import TableLike

__all__ = ["HEALTH_METRICS", "HEALTH_THRESHOLDS", "INDEX_METRICS", "INDEX_THRESHOLDS", "REGION_THRESHOLDS",
           "TABLE_THRESHOLDS", "THRESHOLD_KEYS", "breaches", "measure", "validate_thresholds"]

# threshold key -> the per-region status field it limits
REGION_THRESHOLDS: dict[str, str] = {
    "max_unmerged_generations": "unmerged_generations",
    "max_unmerged_bytes": "unmerged_bytes",
    "max_oldest_unmerged_age_s": "oldest_unmerged_age_s",
    "max_index_lag": "index_lag_generations",
}
# threshold key -> the table-wide field it limits
TABLE_THRESHOLDS: dict[str, str] = {"max_snapshot_age_s": "snapshot_age_s"}
# threshold key -> the table health value it limits (checked when the measurement carries `health`)
HEALTH_THRESHOLDS: dict[str, str] = {
    "max_fragments": "fragments",
    "max_small_fragments": "small_fragments",
    "max_deleted_ratio": "deleted_ratio",
    "max_table_versions": "table_versions",
    "max_mem_wal_bytes": "mem_wal_bytes",
}
# the table health values sent as gauges (memwal.airflow.metrics)
HEALTH_METRICS = ("fragments", "small_fragments", "deleted_ratio", "data_bytes", "table_versions", "base_bytes",
                  "mem_wal_bytes", "gc_reclaimable_bytes")
# threshold key -> the per-index value it limits (`memwal.index_health`, the measurement's `indexes`)
INDEX_THRESHOLDS: dict[str, str] = {"max_index_segments": "segments", "max_unindexed_rows": "unindexed_rows"}
# the per-index values sent as gauges
INDEX_METRICS = ("segments", "indexed_rows", "unindexed_rows", "indexed_fragments", "unindexed_fragments")
THRESHOLD_KEYS = (*REGION_THRESHOLDS, *TABLE_THRESHOLDS, *HEALTH_THRESHOLDS, *INDEX_THRESHOLDS)


def threshold_checks() -> dict[str, Any]:
    """Threshold key -> its check in `memwal.option_values` (the one the CLI and the tables file use)."""
    from memwal import option_values as ov

    counts = ("max_unmerged_generations", "max_index_lag", "max_fragments", "max_small_fragments",
              "max_table_versions", "max_index_segments", "max_unindexed_rows")
    return {**{k: lambda v: ov.count(v, 0) for k in counts},
            "max_unmerged_bytes": ov.byte_size, "max_mem_wal_bytes": ov.byte_size,
            "max_oldest_unmerged_age_s": ov.seconds, "max_snapshot_age_s": ov.seconds,
            "max_deleted_ratio": ov.ratio}


def validate_thresholds(thresholds: Mapping[str, Any] | None, where: str = "thresholds") -> dict[str, float]:
    """Known keys, each value checked by `memwal.option_values` as the CLI and the tables file check it
    (finite, in range; None dropped); one BadInputError naming the bad key and value otherwise."""
    from memwal.errors import BadInputError

    checks = threshold_checks()
    out: dict[str, float] = {}
    for key, value in (thresholds or {}).items():
        if key not in THRESHOLD_KEYS:
            raise BadInputError(f"{where}: unknown threshold {key!r}; known: {', '.join(THRESHOLD_KEYS)}")
        if value is None:
            continue
        try:
            out[key] = checks[key](value)
        except ValueError as exc:
            raise BadInputError(f"{where}: threshold {key!r}: {exc}") from None
    return out


def measure(table: TableLike, now: float | None = None, health: bool = False, *,
            target_rows_per_fragment: int | None = None, storage: bool = False, search: bool = False
            ) -> dict[str, Any]:
    """`memwal status` of the table at its latest version (the handle is refreshed: a poller keeps one
    handle) plus `snapshot_ts_millis` and `snapshot_age_s`, from one index load, and with health=True
    `health` (`memwal.health.table_health`, small fragments against `target_rows_per_fragment`, the
    table's compaction target): the manifest reading, a few requests whatever the table's history; with
    storage=True also the storage reading (a listing of every object and a GC dry run that reads every
    retained version's manifest), which a frequent check must not take.

    snapshot_age_s is None when no snapshot was ever written. With search=True also `search`: per vector or
    FTS index, what a search pays now (memwal.search_costs.search_costs: opens each unmerged generation).
    """
    from memwal.status import table_status  # here, not at import: DAG files import this module
    from memwal.table import MemWalTable

    table = MemWalTable.of(table)
    now = time.time() if now is None else now
    summary = table_status(table.refresh()).to_dict()
    ts = table.details.snapshot_ts_millis
    summary["snapshot_ts_millis"] = ts or None
    summary["snapshot_age_s"] = max(0.0, now - ts / 1000.0) if ts else None
    if health:
        from memwal.health import table_health

        summary["health"] = table_health(table, target_rows_per_fragment, storage=storage,
                                         refresh=False).to_dict()
    from memwal.index_health import index_health  # from the manifest: cheap on every check

    summary["indexes"] = [h.to_dict() for h in index_health(table.dataset)]
    if search:
        from memwal.search_costs import search_costs

        summary["search"] = search_costs(table)
    return summary


def breaches(summary: Mapping[str, Any], thresholds: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Every region value above its threshold, unreadable regions, and a stale or missing snapshot.

    Each breach: key (stable id of what is breached, for alert state), region_id (None for the table),
    metric, value, threshold, message.
    """
    limits = validate_thresholds(thresholds)
    out: list[dict[str, Any]] = []
    for region in summary.get("regions", []):
        rid = region["region_id"]
        for key, metric in REGION_THRESHOLDS.items():
            value = region.get(metric)
            if key in limits and value is not None and value > limits[key]:
                out.append(_breach(rid, metric, value, limits[key]))
        if region.get("error"):
            out.append({**_breach(rid, "unreadable", 1, 0), "message": f"region {rid}: {region['error']}"})
        if region.get("flush_failure"):
            out.append({**_breach(rid, "flush_failing", 1, 0), "message": f"region {rid}: {region['flush_failure']}"})
    if "max_snapshot_age_s" in limits and summary.get("num_regions", 0) > 0:
        age = summary.get("snapshot_age_s")
        if age is None:
            out.append({**_breach(None, "snapshot_age_s", None, limits["max_snapshot_age_s"]),
                        "message": "table: no MemWAL index snapshot was ever written"})
        elif age > limits["max_snapshot_age_s"]:
            out.append(_breach(None, "snapshot_age_s", age, limits["max_snapshot_age_s"]))
    health = summary.get("health") or {}
    for key, metric in HEALTH_THRESHOLDS.items():
        value = health.get(metric)
        if key in limits and value is not None and value > limits[key]:
            out.append(_breach(None, metric, value, limits[key]))
    for index in summary.get("indexes") or []:
        for key, metric in INDEX_THRESHOLDS.items():
            value = index.get(metric)
            if key in limits and value is not None and value > limits[key]:
                out.append({**_breach(None, metric, value, limits[key]), "key": f"index:{index['name']}:{metric}",
                            "index": index["name"],
                            "message": f"index {index['name']}: {metric} {value:g} > {limits[key]:g}"})
    return out


def _breach(region_id: str | None, metric: str, value: float | None, threshold: float) -> dict[str, Any]:
    where = f"region {region_id}" if region_id else "table"
    shown = "none" if value is None else f"{value:g}"
    return {
        "key": f"{region_id or 'table'}:{metric}",
        "region_id": region_id,
        "metric": metric,
        "value": value,
        "threshold": threshold,
        "message": f"{where}: {metric} {shown} > {threshold:g}",
    }
