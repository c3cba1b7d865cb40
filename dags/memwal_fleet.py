"""Fleet mode (docs/airflow.md "Fleet mode"): two DAGs, whatever the tables file holds.

- `memwal_fleet`, on $MEMWAL_FLEET_SCHEDULE (default every 5 minutes; "none": triggered only): one task,
  `probe`, probes every `fleet: true` table and every root's tables, and triggers `memwal_fleet_maintain` only
  when something is due. An idle cycle is that one task instance.
- `memwal_fleet_maintain`, triggered by the probe: `due_work` reads the plan from the run's conf; `maintain`
  (mapped, longest-waiting first, at most $MEMWAL_FLEET_CONCURRENCY at once, default 8) runs one unit each:
  a table on engine in_process / auto (its due jobs in the safe order), or a batch of tables on engines
  spark / spark_connect (at most $MEMWAL_FLEET_BATCH_TABLES tables, default 50, and
  $MEMWAL_FLEET_BATCH_BYTES due bytes, default 1 GiB) whose due jobs run in one application.

This file imports no table code and reads no tables file: the task runner parses it for every fleet task.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, task

from memwal.airflow.operators.fleet import MemWalDueWorkOperator, MemWalFleetProbeOperator

FLEET_DAG_ID = "memwal_fleet"
MAINTAIN_DAG_ID = "memwal_fleet_maintain"
START = datetime(2025, 1, 1, tzinfo=UTC)


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name) or str(default)
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"${name} must be a whole number >= 1, not {text!r}")
    return int(text)


_schedule = os.environ.get("MEMWAL_FLEET_SCHEDULE", "*/5 * * * *")
_pool = os.environ.get("MEMWAL_FLEET_POOL") or None  # e.g. memwal_spark: shared with the per-table DAGs

with DAG(
    dag_id=FLEET_DAG_ID,
    description="MemWAL fleet: probe every fleet table and root; trigger maintenance only for due work",
    schedule=None if _schedule.lower() in ("none", "") else _schedule,
    start_date=START,
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=30),
    default_args={"owner": "memwal", "retries": 1, "retry_delay": timedelta(seconds=30)},
    tags=["memwal", "memwal_fleet"],
    doc_md=__doc__,
):
    MemWalFleetProbeOperator(task_id="probe", trigger_dag_id=MAINTAIN_DAG_ID,
                             max_tables=_env_int("MEMWAL_FLEET_MAX_TABLES", 64),
                             max_workers=_env_int("MEMWAL_FLEET_PROBE_WORKERS", 16),
                             max_batch_tables=_env_int("MEMWAL_FLEET_BATCH_TABLES", 50),
                             max_batch_bytes=_env_int("MEMWAL_FLEET_BATCH_BYTES", 1024**3))

with DAG(
    dag_id=MAINTAIN_DAG_ID,
    description="MemWAL fleet: each due table's due jobs, in the safe order (triggered by memwal_fleet)",
    schedule=None,
    start_date=START,
    catchup=False,
    max_active_runs=_env_int("MEMWAL_FLEET_MAX_RUNS", 4),
    is_paused_upon_creation=False,  # runs only when the probe triggers it
    default_args={"owner": "memwal", "retries": 2, "retry_delay": timedelta(seconds=60),
                  "retry_exponential_backoff": 2.0},
    tags=["memwal", "memwal_fleet"],
    doc_md=__doc__,
):

    @task
    def due_work() -> list:
        """The plan the probe put in this run's conf: tables and batches, longest-waiting first."""
        from airflow.sdk import get_current_context

        return list((get_current_context()["dag_run"].conf or {}).get("work") or [])

    MemWalDueWorkOperator.partial(
        task_id="maintain", map_index_template="{{ memwal_table }}",
        max_active_tis_per_dag=_env_int("MEMWAL_FLEET_CONCURRENCY", 8), **({"pool": _pool} if _pool else {}),
    ).expand(item=due_work())
