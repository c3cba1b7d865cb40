"""A merge that fails part-way (a MemWAL index lock timeout after one region committed, exit 3) under
`dag.test()`: Airflow records no asset event of a failed task (the probe shows it), so the merge operator
keeps what the failed attempt merged in the task state store and the retry's event announces it with its
own merges: downstream DAGs see every region that was merged."""

from __future__ import annotations

import shutil
from pathlib import Path

from airflow_support import lance_core_table, merged_generations, run_dags, tables_file, task_states, xcom

HERE = Path(__file__).resolve().parent


def test_the_retry_event_announces_what_the_failed_attempt_merged(airflow_home, local_location, tmp_path):
    a, b = lance_core_table(local_location, regions=2, generations=2)
    dags = tmp_path / "dags"
    dags.mkdir()
    for name in ("memwal_partial_merge", "probe_failed_task_event"):
        shutil.copy(HERE / "partial_merge_dags.py", dags / f"{name}.py")
    faults = tmp_path / "faults"
    faults.mkdir()
    env = {"AIRFLOW__CORE__DAGS_FOLDER": str(dags), "MEMWAL_TEST_FAULT_DIR": str(faults),
           "MEMWAL_TABLES_FILE": str(tables_file(tmp_path / "tables.yaml", {"t1": {
               "uri": local_location.uri, "engine": "in_process", "schedule": None,
               "max_generations_per_commit": 1, "max_bytes_per_commit": 1}}))}  # a commit per region batch
    probe, report = run_dags(airflow_home, [("probe_failed_task_event", None), ("memwal_partial_merge", None)],
                             extra_env=env)

    assert probe["state"] == "failed" and probe["asset_events"] == [], (
        "Airflow records no asset event of a failed task, even one attached before it failed")

    assert (faults / "failed").exists(), "the first attempt failed part-way"
    first = (faults / "first_region").read_text()
    second = b if first == a else a
    assert report["state"] == "success" and task_states(report)[("merge", -1)] == "success", report["log"][-3000:]
    assert merged_generations(local_location) == {a: 2, b: 2}
    (summary,) = xcom(report, "merge")
    assert [r["region_id"] for r in summary["regions"] if r["generations"]] == [second], (
        "the retry merged only the second region", summary)

    (event,) = report["asset_events"]
    assert event["asset"] == "memwal__t1" and event["source_task_id"] == "merge"
    extra = event["extra"]
    assert extra["regions"][first]["generations"] == [1, 2], "the failed attempt's merges are announced"
    assert extra["regions"][second]["generations"] == [1, 2]
    assert {r: (v["merged_generation_before"], v["merged_generation_after"]) for r, v in extra["regions"].items()} \
        == {a: (0, 2), b: (0, 2)}
    assert extra["generations_merged"] == 4
    assert "Airflow emits no asset event from a failed task, so the retry's event announces them" in report["log"]


class _Store(dict):
    """The task state store's get / set / delete, shared by the attempts of one task."""

    def set(self, key, value):
        self[key] = value

    def delete(self, key):
        self.pop(key, None)


class _Events:
    def __init__(self):
        self.added = []

    def __getitem__(self, outlet):
        return self

    def add(self, asset, extra=None):
        self.added.append((asset.name, extra))


def test_a_retry_that_merges_nothing_new_still_announces_the_failed_attempt():
    """Another merger may merge the rest between the attempts: the retry merges nothing, yet its event
    announces what the failed attempt committed; a later attempt announces nothing twice."""
    from types import SimpleNamespace

    from memwal.airflow.config import parse_tables
    from memwal.airflow.hooks.memwal import JobRun
    from memwal.airflow.operators.memwal import UNANNOUNCED_KEY, MemWalMergeOperator

    cfg = parse_tables({"tables": {"t1": {"uri": "/t1"}}}, "tables.yaml")[0]["t1"]
    op = MemWalMergeOperator(task_id="merge", table="t1")
    region = {"region_id": "r1", "generations": [4, 5], "merged_generation_before": 3, "merged_generation_after": 5,
              "rows_upserted": 7, "rows_deleted": 1}
    failed = {"generations_merged": 2, "rows_upserted": 7, "rows_deleted": 1, "table_version_before": 10,
              "table_version_after": 12, "regions": [region, {"region_id": "r2", "generations": [], "error": "lock"}]}
    nothing = {"generations_merged": 0, "table_version_before": 13, "table_version_after": 13,
               "regions": [{"region_id": "r2", "generations": []}]}
    store = _Store()
    first = {"task_state_store": store, "ti": SimpleNamespace(try_number=1), "outlet_events": _Events()}
    op.after_job(first, cfg, JobRun("merge", failed, 3, "region r2: lock"))
    assert first["outlet_events"].added == [] and store[UNANNOUNCED_KEY]["regions"]["r1"]["generations"] == [4, 5]

    retry = {"task_state_store": store, "ti": SimpleNamespace(try_number=2), "outlet_events": _Events()}
    op.after_job(retry, cfg, JobRun("merge", nothing, 0, None))
    [(asset, extra)] = retry["outlet_events"].added
    assert asset == "memwal__t1" and extra["generations_merged"] == 2 and extra["table_version_before"] == 10
    assert extra["regions"] == {"r1": {k: v for k, v in region.items() if k != "region_id"}}
    assert UNANNOUNCED_KEY not in store, "announced once"

    again = {"task_state_store": store, "ti": SimpleNamespace(try_number=3), "outlet_events": _Events()}
    op.after_job(again, cfg, JobRun("merge", nothing, 0, None))
    assert again["outlet_events"].added == []
