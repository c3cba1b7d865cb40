"""A DAG file for test_task_faults.py, copied into the test's own DAG folder (not a repository DAG).

`memwal_faulty_store_merge`: the real merge operator with one immediate retry. Its on_retry_callback (Airflow
runs it only for a task it will retry) writes the first attempt's error to $MEMWAL_TEST_FAULT_DIR/retried:
the test's fault proxy stops failing once that file exists, so the retry meets a store that answers again.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import dag

from memwal.airflow.operators.memwal import MemWalMergeOperator

FAULTS = Path(os.environ["MEMWAL_TEST_FAULT_DIR"])


def _record_retry(context) -> None:
    exc = context.get("exception")
    (FAULTS / "retried.tmp").write_text(f"{type(exc).__module__}.{type(exc).__qualname__}\n{exc}")
    (FAULTS / "retried.tmp").rename(FAULTS / "retried")


@dag(dag_id="memwal_faulty_store_merge", schedule=None, start_date=datetime(2025, 1, 1), catchup=False)
def memwal_faulty_store_merge():
    MemWalMergeOperator(task_id="merge", table="t1", retries=1, retry_delay=timedelta(0),
                        on_retry_callback=_record_retry)


memwal_faulty_store_merge()
