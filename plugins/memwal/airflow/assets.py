"""Airflow Assets of MemWAL tables.

`table_asset(cfg)`: the table itself. The merge operator emits an event on it after a successful merge,
its `extra` carrying the merge summary (merged generations per region, rows), so downstream DAGs can be
scheduled on "table merged". (airflow-core wrote this fallback; airflow-lag adds `lag_asset(cfg)`, the
asset with the AssetWatcher that fires when the table's lag crosses a threshold.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow.sdk import Asset

    from memwal.airflow.config import TableConfig

__all__ = ["lag_asset", "lag_asset_name", "table_asset"]


def table_asset(cfg: TableConfig) -> Asset:
    """The asset of a configured table: name `memwal__<table>`, URI `memwal://<table>`."""
    from airflow.sdk import Asset

    return Asset(name=f"memwal__{cfg.name}", uri=f"memwal://{cfg.name}", group="memwal",
                 extra={"table_uri": cfg.uri})


# --- the lag asset (airflow-lag) ------------------------------------------------------------------------

DEFAULT_LAG_POLL_INTERVAL_S = 60.0
LAG_POLL_INTERVAL_ENV = "MEMWAL_LAG_POLL_INTERVAL_S"  # seconds between the lag watcher's polls (default 60)


def lag_asset_name(table: str) -> str:
    """Name of a table's lag asset; its state store also keeps the lag history (memwal.airflow.history)."""
    return f"memwal_lag__{table}"


def _poll_interval(cfg: TableConfig) -> float:
    import os

    raw = getattr(cfg, "lag_poll_interval_s", None) or os.environ.get(LAG_POLL_INTERVAL_ENV)
    try:
        value = float(raw) if raw else DEFAULT_LAG_POLL_INTERVAL_S
    except ValueError:
        raise ValueError(f"${LAG_POLL_INTERVAL_ENV}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise ValueError(f"table {cfg.name!r}: the lag poll interval must be > 0 seconds, got {value}")
    return value


def lag_asset(cfg: TableConfig, *, watch: bool = True) -> Asset:
    """The table's lag as an Asset, name `memwal_lag__<table>`, URI `memwal://<table>/lag`.

    Its AssetWatcher runs `MemWalLagEventTrigger` in the triggerer, which emits an event each time the
    table's lag crosses one of its thresholds; the maintenance DAG is scheduled on this asset (besides its
    clock). `watch=False` gives the same asset without the watcher (for inlets and references).
    """
    from airflow.sdk import Asset, AssetWatcher

    from memwal.airflow.triggers.memwal import MemWalLagEventTrigger, thresholds_of

    watchers = []
    if watch:
        trigger = MemWalLagEventTrigger(
            table=cfg.name,
            table_uri=cfg.uri,
            conn_id=cfg.conn_id,
            thresholds=thresholds_of(cfg),
            poll_interval_s=_poll_interval(cfg),
        )
        watchers.append(AssetWatcher(name=f"memwal_lag_watcher__{cfg.name}", trigger=trigger))
    return Asset(name=lag_asset_name(cfg.name), uri=f"memwal://{cfg.name}/lag", group="memwal", watchers=watchers)
