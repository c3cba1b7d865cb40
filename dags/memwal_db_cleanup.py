"""memwal_db_cleanup: once a day, `airflow db clean` of the metadata DB's rows older than the retention (DAG
runs, task instances, XComs, logs, ...), a dry run unless the Variable `memwal_db_cleanup` says
{"dry_run": false}. Settings and why a subprocess: `memwal.airflow.db_cleanup`; what the DB grows by per day
and what to set: docs/airflow.md "What the metadata database grows by".

Schedule: $MEMWAL_DB_CLEANUP_SCHEDULE (default @daily).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import dag, task


@dag(
    dag_id="memwal_db_cleanup",
    schedule=os.environ.get("MEMWAL_DB_CLEANUP_SCHEDULE", "@daily"),
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(hours=2),
    tags=["memwal"],
    default_args={"retries": 0},
    doc_md=__doc__,
)
def memwal_db_cleanup():
    @task
    def clean_metadata_db() -> dict:
        """Delete (or, by default, count) the rows past the retention; a bad setting fails naming the key."""
        from airflow.sdk import Variable
        from airflow.sdk.exceptions import AirflowFailException

        from memwal.airflow.db_cleanup import VARIABLE, parse_settings, run_cleanup

        try:
            settings = parse_settings(Variable.get(VARIABLE, default=None))
        except ValueError as exc:
            raise AirflowFailException(str(exc)) from None
        return run_cleanup(settings)

    clean_metadata_db()


memwal_db_cleanup()
