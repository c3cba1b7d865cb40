"""`memwal_backfill`: drain a table's backlog in bounded chunks (mapped tasks), then catch-up and snapshot."""

from memwal.airflow.config import load_tables_and_errors
from memwal.airflow.dag_factory import backfill_dag

memwal_backfill = backfill_dag(load_tables_and_errors(use_variable=False)[0])
