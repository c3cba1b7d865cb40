"""memwal_lag_monitor: every few minutes, one task checks every configured table (at most
$MEMWAL_LAG_MONITOR_CONCURRENCY at once, default 8): measure the lag, emit the `memwal.*` metrics, record the
lag history, alert through the table's notifiers once when a threshold is crossed and once when it is back
under, probe the due work, and save one row per table for the MemWAL page. Logic lives in
`memwal.airflow.monitor.check_fleet`; this file only wires (it reads the tables file for the lag assets the
task keeps its state in, nothing else).

One task per cycle, not one per table: at 1,000 tables and every 5 minutes, mapped tasks would be 288,000 task
instances a day in the metadata DB (docs/airflow.md "What the metadata database grows by").

Schedule: $MEMWAL_LAG_MONITOR_SCHEDULE (default every 5 minutes). A table whose lag cannot be measured, or
whose tables-file entry is bad, is alerted on and reported (its row on the page, the task's log) while the
others are checked; the task then fails naming it, without a retry (the next cycle checks it again; a retry
would check every table twice).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import dag, get_current_context, task

from memwal.airflow.assets import lag_asset
from memwal.airflow.config import TableConfigError, load_tables_and_errors

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
    default_args={"retries": 0},
    doc_md=__doc__,
)
def memwal_lag_monitor():
    @task(inlets=[lag_asset(cfg) for cfg in _TABLES.values()], multiple_outputs=False)  # one XCom, not one a key
    def check_tables() -> dict:
        """Every table checked, probed and saved for the page; fails (AirflowFailException, no retry) after
        the whole cycle when a table's lag could not be measured, naming it."""
        from airflow.sdk.exceptions import AirflowFailException

        from memwal.airflow.monitor import check_fleet

        result = check_fleet(context=get_current_context())
        if result["status_error"]:
            raise AirflowFailException(result["status_error"])
        if result["failed"]:
            names = sorted(result["failed"])
            raise AirflowFailException(
                f"{len(names)} of {result['tables']} table(s) not measured: "
                + "; ".join(f"{n}: {result['failed'][n]}" for n in names[:10]) + (" ..." if len(names) > 10 else ""))
        return result

    check_tables()


memwal_lag_monitor()
