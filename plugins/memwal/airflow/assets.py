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

__all__ = ["table_asset"]


def table_asset(cfg: TableConfig) -> Asset:
    """The asset of a configured table: name `memwal__<table>`, URI `memwal://<table>`."""
    from airflow.sdk import Asset

    return Asset(name=f"memwal__{cfg.name}", uri=f"memwal://{cfg.name}", group="memwal",
                 extra={"table_uri": cfg.uri})
