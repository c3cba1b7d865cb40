"""DAG files for test_merge_partial_event.py, copied into a test's own DAG folder (not a repository DAG).

`memwal_partial_merge`: one merge task with one retry whose first attempt fails part-way: the MemWAL index
lock "times out" (LockTimeoutError) at the first commit of the second region, after the first region's
commits; the flag files in $MEMWAL_TEST_FAULT_DIR make that happen once, whichever process runs the try.
`probe_failed_task_event`: a task that attaches an asset event, then fails: what Airflow keeps of it.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import Asset, dag, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException

import memwal.merge as merge_module
from memwal.airflow.operators.memwal import MemWalMergeOperator
from memwal.errors import LockTimeoutError

FAULTS = Path(os.environ["MEMWAL_TEST_FAULT_DIR"])
_commit = merge_module._commit


def _commit_until_the_second_region(table, markers, data, since):
    first, failed = FAULTS / "first_region", FAULTS / "failed"
    regions = {region for region, _ in markers}
    if not first.exists():
        first.write_text(sorted(regions)[0])
    if first.read_text() not in regions and not failed.exists():
        failed.write_text("once")
        raise LockTimeoutError("memwal index lock", "a compaction round", 900)
    return _commit(table, markers, data, since)


if merge_module._commit is _commit:
    merge_module._commit = _commit_until_the_second_region


@dag(dag_id="memwal_partial_merge", schedule=None, start_date=datetime(2025, 1, 1), catchup=False)
def memwal_partial_merge():
    MemWalMergeOperator(task_id="merge", table="t1", retries=1, retry_delay=timedelta(0))


PROBE = Asset(name="probe_failed_task_event", uri="probe://failed-task-event")


@dag(dag_id="probe_failed_task_event", schedule=None, start_date=datetime(2025, 1, 1), catchup=False)
def probe_failed_task_event():
    @task(outlets=[PROBE])
    def attach_then_fail():
        get_current_context()["outlet_events"][PROBE].extra = {"attached": "before failing"}
        raise AirflowFailException("fails after attaching an asset event")

    attach_then_fail()


memwal_partial_merge()
probe_failed_task_event()
