"""One `memwal_maintenance__<table>` DAG per table in the tables file (memwal.airflow.config).

Adding a table to dags/memwal_tables.yaml adds its DAG; an invalid entry shows as this file's import
error naming the table and the key, and the other tables' DAGs still load. A `fleet: true` table and a root
entry have no DAG here: the fleet DAG (dags/memwal_fleet.py) maintains them. No I/O but reading the file.
"""

from memwal.airflow.config import load_tables_and_errors
from memwal.airflow.dag_factory import invalid_table_dag, maintenance_dag

_tables, _errors = load_tables_and_errors(use_variable=False)
for _name, _cfg in _tables.items():
    if _cfg.fleet:  # maintained by the fleet DAG (dags/memwal_fleet.py), no DAG of its own
        continue
    globals()[f"memwal_maintenance__{_name}"] = maintenance_dag(_cfg)
for _name, _error in _errors.items():
    globals()[f"memwal_maintenance__{_name}"] = invalid_table_dag(_name, _error)
