"""`memwal_merge`: merge one configured table now, from the trigger form (Params); dry run shows the plan."""

from memwal.airflow.config import load_tables_and_errors
from memwal.airflow.dag_factory import merge_dag

memwal_merge = merge_dag(load_tables_and_errors(use_variable=False)[0])
