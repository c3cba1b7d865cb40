"""memwal_lag_monitor: every few minutes, per configured table (one mapped task each): measure the lag,
emit the `memwal.*` metrics, record the lag history, and alert through the table's notifiers once when a
threshold is crossed and once when it is back under. Logic lives in `memwal.airflow.monitor`; this file
only wires (it reads the tables file for the lag assets the tasks keep their state in, nothing else).

Schedule: $MEMWAL_LAG_MONITOR_SCHEDULE (default every 5 minutes). A check that fails is retried once after
$MEMWAL_LAG_MONITOR_RETRY_DELAY_S seconds (default 30); a bad tables-file entry fails its own check
without a retry (the other tables are still checked).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import dag, get_current_context, task

from memwal.airflow.assets import lag_asset
from memwal.airflow.config import TableConfigError, load_tables_and_errors

try:
    _RETRY_DELAY = timedelta(seconds=float(os.environ.get("MEMWAL_LAG_MONITOR_RETRY_DELAY_S") or 30))
except ValueError:
    raise ValueError("$MEMWAL_LAG_MONITOR_RETRY_DELAY_S must be a number of seconds, not "
                     f"{os.environ['MEMWAL_LAG_MONITOR_RETRY_DELAY_S']!r}") from None

try:
    _TABLES = load_tables_and_errors(use_variable=False)[0]
except TableConfigError:  # the maintenance DAGs report a broken tables file; the monitor still loads
    _TABLES = {}


@dag(
    dag_id="memwal_lag_monitor",
    schedule=os.environ.get("MEMWAL_LAG_MONITOR_SCHEDULE", "*/5 * * * *"),
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=30),
    tags=["memwal"],
    default_args={"retries": 1, "retry_delay": _RETRY_DELAY},
    doc_md=__doc__,
)
def memwal_lag_monitor():
    @task
    def configured_tables() -> list[str]:
        """Tables to check now (the tables file with the `memwal_tables` Variable applied)."""
        from memwal.airflow.monitor import configured_tables

        return configured_tables()

    @task(map_index_template="{{ memwal_table }}", inlets=[lag_asset(cfg) for cfg in _TABLES.values()])
    def check_lag(table: str) -> dict:
        """Metrics, history and alerts for one table; fails (after alerting) if its lag cannot be measured,
        and without a retry if its entry in the tables file is bad."""
        from memwal.airflow.monitor import check_configured_table

        context = get_current_context()
        context["memwal_table"] = table  # type: ignore[typeddict-unknown-key]
        return check_configured_table(table, context)

    check_lag.expand(table=configured_tables())


memwal_lag_monitor()
