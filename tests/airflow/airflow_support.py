"""Helpers for the Airflow tests (airflow-core): an Airflow home on SQLite, MemWAL tables written by Lance
core's writer, a tables file, and `dag.test()` in a child process (tests/airflow/dag_runner.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from memwal.mem_wal_index import load_index
from memwal.region_manifest import load_latest_manifest

from support.tables import create_base, lance_core_scan, open_base, rows, sorted_rows

REPO = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).resolve().with_name("dag_runner.py")
DAG_TEST_TIMEOUT_S = 600


class DictStore:
    """An in-memory stand-in for a lag asset's state store (get / set / delete)."""

    def __init__(self) -> None:
        self.values: dict = {}

    def get(self, key):
        return self.values.get(key)

    def set(self, key, value) -> None:
        self.values[key] = value

    def delete(self, key) -> None:
        self.values.pop(key, None)


def airflow_env(home: Path) -> dict[str, str]:
    """The environment of an Airflow home on SQLite with this repository's dags/ and no plugins."""
    plugins = home / "plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "AIRFLOW__"))}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    })
    return env


def migrate(env: dict[str, str]) -> None:
    airflow = Path(sys.executable).with_name("airflow")
    subprocess.run([str(airflow), "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)


def run_dag(env: dict[str, str], dag_id: str, conf: dict | None = None, extra_env: dict | None = None) -> dict:
    """dag.test() of dag_id in a child process; its JSON report plus `log` (the child's output)."""
    cmd = [sys.executable, str(RUNNER), dag_id] + ([json.dumps(conf)] if conf is not None else [])
    proc = subprocess.run(cmd, env={**env, **(extra_env or {})}, capture_output=True, text=True,
                          timeout=DAG_TEST_TIMEOUT_S, cwd=str(REPO))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"dag_runner gave no report (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    report = json.loads(lines[-1])
    report["log"] = proc.stdout + proc.stderr
    return report


def run_dags(env: dict[str, str], runs: list[tuple[str, dict | None]], extra_env: dict | None = None) -> list[dict]:
    """Several dag.test() runs one after the other in one child process (saves Airflow's start-up)."""
    cmd = [sys.executable, str(RUNNER), "--runs", json.dumps([list(r) for r in runs])]
    proc = subprocess.run(cmd, env={**env, **(extra_env or {})}, capture_output=True, text=True,
                          timeout=DAG_TEST_TIMEOUT_S * len(runs), cwd=str(REPO))
    reports = next((v for v in map(_json_or_none, reversed(proc.stdout.splitlines())) if isinstance(v, list)), None)
    assert reports, f"dag_runner gave no report (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    for r in reports:
        r["log"] = proc.stdout + proc.stderr
    return reports


def _json_or_none(line: str):
    try:
        return json.loads(line)
    except ValueError:
        return None


def task_states(report: dict) -> dict[tuple[str, int], str]:
    return {(t["task_id"], t["map_index"]): t["state"] for t in report["tasks"]}


def xcom(report: dict, task_id: str, key: str = "return_value") -> list:
    """Values of one task's XCom key, ordered by map index."""
    found = sorted((x for x in report["xcoms"] if x["task_id"] == task_id and x["key"] == key),
                   key=lambda x: x["map_index"])
    return [x["value"] for x in found]


def lance_core_table(location, regions: int = 2, generations: int = 3) -> list[str]:
    """A base table (ids 0..5) with MemWAL; each region gets `generations` flushed generations from
    Lance core's ShardWriter (8 rows each, every generation updating 4 keys of the previous one)."""
    create_base(location, ids=range(6))
    open_base(location).initialize_mem_wal(bucket_column="id", num_buckets=2)
    open_base(location).create_scalar_index("name", "BTREE", name="name_idx")
    ids = [str(uuid.uuid4()) for _ in range(regions)]
    for n, region in enumerate(ids):
        add_generations(location, region, generations, start=1000 * (n + 1))
    return ids


def add_generations(location, region: str, generations: int, start: int) -> None:
    with open_base(location).mem_wal_writer(region, max_memtable_rows=8) as w:
        for g in range(generations):
            w.put(rows(range(start + 4 * g, start + 4 * g + 8), f"g{g}-"))


def lsm_view(location) -> list[dict]:
    """What Lance core's LSM reader sees now (the model the merged base table must equal)."""
    return sorted_rows(lance_core_scan(location))


def base_rows(location) -> list[dict]:
    return sorted_rows(open_base(location).to_table())


def merged_generations(location) -> dict[str, int]:
    return dict(load_index(location.uri, location.storage_options).merged_generations)


def flushed_max(location, region: str) -> int:
    return max(fg.generation for fg in load_latest_manifest(location.store(), region).flushed_generations)


def tables_file(path: Path, tables: dict) -> Path:
    """A tables file (JSON is YAML) with the given entries."""
    path.write_text(json.dumps({"tables": tables}))
    return path
