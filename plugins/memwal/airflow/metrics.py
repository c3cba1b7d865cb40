"""Lag metrics through Airflow's Stats (StatsD when `[metrics] statsd_on`, or Datadog/OpenTelemetry).

Names (each gauge also carries tags `table` and, per region, `region`, for backends with tags; StatsD
prefixes them with `[metrics] statsd_prefix`, default `airflow.`):

    memwal.<table>.<region>.unmerged_generations    flushed generations not yet merged
    memwal.<table>.<region>.unmerged_rows           rows in them
    memwal.<table>.<region>.unmerged_bytes          data bytes in them
    memwal.<table>.<region>.oldest_unmerged_age_s   age of the oldest unmerged generation (0: none)
    memwal.<table>.<region>.index_lag_generations   merged generation minus the laggiest index's
    memwal.<table>.<region>.unreadable              1 when the region's status could not be read
    memwal.<table>.<region>.flush_failing           1 when the region's writer cannot flush (memwal.flush_failure)
    memwal.<table>.regions                          number of regions
    memwal.<table>.unmerged_generations             sum over regions
    memwal.<table>.unmerged_rows                    sum over regions
    memwal.<table>.unmerged_bytes                   sum over regions
    memwal.<table>.oldest_unmerged_age_s            max over regions (0: none)
    memwal.<table>.index_lag_generations            max over regions
    memwal.<table>.snapshot_age_s                   age of the MemWAL index snapshot (not sent if none)
    memwal.<table>.breaches                         thresholds breached now (0: within thresholds)
    memwal.<table>.fragments                        base-table fragments (memwal.health)
    memwal.<table>.small_fragments                  fragments under half compaction's target rows
    memwal.<table>.deleted_ratio                    deleted rows / physical rows of the base table
    memwal.<table>.data_bytes                       bytes of the latest version's data files (its manifest)
    memwal.<table>.table_versions                   base-table versions Lance keeps (retention bounds it)
    memwal.<table>.base_bytes                       bytes of the base table on storage (without _mem_wal)
    memwal.<table>.mem_wal_bytes                    bytes under _mem_wal/ (generations, WAL, manifests)
    memwal.<table>.gc_reclaimable_bytes             what GC could free (dry run)
    memwal.<table>.index.<index>.segments           segments of one base-table index (memwal.index_health)
    memwal.<table>.index.<index>.indexed_rows       rows it covers
    memwal.<table>.index.<index>.unindexed_rows     rows it does not cover yet (catch-up adds them)
    memwal.<table>.index.<index>.indexed_fragments  fragments it covers
    memwal.<table>.index.<index>.unindexed_fragments  fragments it does not cover

base_bytes, mem_wal_bytes and gc_reclaimable_bytes come from the storage reading
(`memwal.health.storage_health`), which the lag monitor takes at its own slower cadence: between two
readings the gauges repeat the last one.

`<table>` is the configured table name with any character outside [A-Za-z0-9_-] replaced by `_` (a dot
would add a StatsD level), `<index>` the index name likewise (tag `index`: the name as is); `<region>` is
the region UUID.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from memwal.lag import HEALTH_METRICS, INDEX_METRICS

__all__ = ["HEALTH_METRICS", "INDEX_METRICS", "REGION_METRICS",
           "TABLE_METRICS", "emit_lag_metrics", "lag_metrics", "metric_table_name"]

REGION_METRICS = ("unmerged_generations", "unmerged_rows", "unmerged_bytes", "oldest_unmerged_age_s",
                  "index_lag_generations", "unreadable", "flush_failing")
TABLE_METRICS = ("regions", "unmerged_generations", "unmerged_rows", "unmerged_bytes", "oldest_unmerged_age_s",
                 "index_lag_generations", "snapshot_age_s", "breaches")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def metric_table_name(table: str) -> str:
    return _UNSAFE.sub("_", table)


def lag_metrics(table: str, summary: Mapping[str, Any], breaches: int = 0) -> list[tuple[str, float, dict[str, str]]]:
    """(name, value, tags) of every gauge for one measurement (`memwal.lag.measure`)."""
    t = metric_table_name(table)
    out: list[tuple[str, float, dict[str, str]]] = []
    for r in summary.get("regions", []):
        rid = r["region_id"]
        values = {
            "unmerged_generations": r.get("unmerged_generations", 0),
            "unmerged_rows": r.get("unmerged_rows", 0),
            "unmerged_bytes": r.get("unmerged_bytes", 0),
            "oldest_unmerged_age_s": r.get("oldest_unmerged_age_s") or 0.0,
            "index_lag_generations": r.get("index_lag_generations", 0),
            "unreadable": 1 if r.get("error") else 0,
            "flush_failing": 1 if r.get("flush_failure") else 0,
        }
        out += [(f"memwal.{t}.{rid}.{k}", float(values[k]), {"table": table, "region": rid}) for k in REGION_METRICS]
    values = {
        "regions": summary.get("num_regions", len(summary.get("regions", []))),
        "unmerged_generations": summary.get("unmerged_generations", 0),
        "unmerged_rows": summary.get("unmerged_rows", 0),
        "unmerged_bytes": summary.get("unmerged_bytes", 0),
        "oldest_unmerged_age_s": summary.get("oldest_unmerged_age_s") or 0.0,
        "index_lag_generations": summary.get("max_index_lag_generations", 0),
        "snapshot_age_s": summary.get("snapshot_age_s"),
        "breaches": breaches,
    }
    out += [(f"memwal.{t}.{k}", float(values[k]), {"table": table}) for k in TABLE_METRICS if values[k] is not None]
    health = summary.get("health") or {}
    out += [(f"memwal.{t}.{k}", float(health[k]), {"table": table})
            for k in HEALTH_METRICS if health.get(k) is not None]
    for index in summary.get("indexes") or []:
        name = index["name"]
        out += [(f"memwal.{t}.index.{metric_table_name(name)}.{k}", float(index[k]),
                 {"table": table, "index": name}) for k in INDEX_METRICS if index.get(k) is not None]
    return out


def _stats() -> Any:
    """The task SDK's Stats, initialised from `[metrics]` if this process has not done it yet (outside a
    task runner, e.g. `dag.test()` or a script)."""
    from airflow.sdk._shared.observability.metrics import stats as stats_module
    from airflow.sdk.observability.stats import Stats

    if getattr(stats_module, "_factory", None) is None:
        from airflow.sdk.configuration import conf
        from airflow.sdk.observability.metrics.stats_utils import get_stats_factory

        Stats.initialize(factory=get_stats_factory(),
                         export_legacy_names=conf.getboolean("metrics", "legacy_names_on", fallback=True))
    return Stats


def emit_lag_metrics(table: str, summary: Mapping[str, Any], breaches: int = 0) -> list[tuple[str, float]]:
    """Send every gauge of one measurement; returns (name, value) sent."""
    stats = _stats()
    sent = []
    for name, value, tags in lag_metrics(table, summary, breaches):
        stats.gauge(name, value, tags=tags)
        sent.append((name, value))
    return sent
