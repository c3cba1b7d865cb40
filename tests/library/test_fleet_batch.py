"""memwal.fleet_batch: small tables' due jobs packed by bytes into application-sized batches, the batch file, and
a batch run table by table (in process here; on Spark in tests/spark/test_fleet_spark.py), each table's jobs in
the safe order and one table's failure its own result."""

from __future__ import annotations

import json

import pytest

from memwal.due_rules import DueJob
from memwal.errors import BadInputError
from memwal.fleet_batch import (
    TableDue,
    batch_from_json,
    batch_summary,
    batch_to_json,
    due_bytes,
    from_probe,
    in_process,
    pack_batches,
    run_batch,
)
from memwal.job_config import JobOptions
from memwal.merge import MergeConfig
from memwal.probe import ProbeResult, probe_table
from memwal.reader import LsmReader
from memwal.table import MemWalTable

from support.maintenance import build_table
from support.tables import open_base, sorted_rows

MIB = 1024 * 1024


def _due(name: str, mib: int, jobs=("merge", "snapshot"), group=None) -> TableDue:
    return TableDue(f"/t/{name}", tuple(jobs), mib * MIB, name=name, group=group)


# --- packing -------------------------------------------------------------------------------------------------


def test_twenty_small_tables_make_one_batch_and_idle_tables_none():
    entries = [_due(f"t{i}", 1) for i in range(20)] + [_due("idle", 0, jobs=())]
    batches = pack_batches(entries)
    assert len(batches) == 1 and len(batches[0]) == 20
    assert "idle" not in {e.name for e in batches[0]}, "a table with nothing due starts no Spark"
    assert pack_batches([_due("idle", 0, jobs=())]) == []


def test_first_fit_decreasing_by_bytes_within_the_byte_and_table_bounds():
    sizes = {"a": 6, "b": 5, "c": 4, "d": 3, "e": 2, "huge": 30}
    batches = pack_batches([_due(n, s) for n, s in sizes.items()], max_bytes=10 * MIB, max_tables=3)
    assert [[e.name for e in b] for b in batches] == [["huge"], ["a", "c"], ["b", "d", "e"]]
    assert all(sum(e.bytes for e in b) <= 10 * MIB for b in batches[1:]), "only a table over the bound is alone"
    few = pack_batches([_due(f"t{i}", 0) for i in range(7)], max_tables=3)
    assert [len(b) for b in few] == [3, 3, 1]


def test_tables_of_different_groups_never_share_a_batch():
    batches = pack_batches([_due("a", 1, group="conn1"), _due("b", 1, group="conn2"), _due("c", 1, group="conn1")])
    assert [[e.name for e in b] for b in batches] == [["a", "c"], ["b"]]


def test_bad_bounds_and_bad_entries_are_named():
    with pytest.raises(BadInputError, match="max_bytes"):
        pack_batches([], max_bytes=0)
    with pytest.raises(BadInputError, match="max_tables"):
        pack_batches([], max_tables=-1)
    with pytest.raises(BadInputError, match=r"table /t/x: job 'vacuum'"):
        TableDue("/t/x", ("merge", "vacuum"))
    with pytest.raises(BadInputError, match="table /t/x: bytes -1"):
        TableDue("/t/x", ("merge",), -1)


def test_jobs_are_kept_in_the_safe_order():
    assert TableDue("/t/x", ("gc", "snapshot", "merge", "catchup")).jobs == ("merge", "catchup", "snapshot", "gc")


def test_from_probe_takes_the_due_jobs_and_their_bytes():
    due = [DueJob("merge", "2 unmerged", {"bytes": 3000}), DueJob("snapshot", "never", {"regions": 1}),
           DueJob("gc", "collectable", {"bytes": 500})]
    assert due_bytes(due) == 3500
    entry = from_probe(ProbeResult("/t/x", "ok", due=due, name="x"), group="c")
    assert (entry.uri, entry.jobs, entry.bytes, entry.name, entry.group) == (
        "/t/x", ("merge", "snapshot", "gc"), 3500, "x", "c")
    assert from_probe(ProbeResult("/t/y", "ok")) is None, "an idle table: no batch entry"
    assert from_probe(ProbeResult("/t/z", "error", due=due, error="boom")) is None


# --- the batch file ------------------------------------------------------------------------------------------


def test_the_batch_file_carries_jobs_and_options_but_no_storage_options():
    options = JobOptions(merge=MergeConfig(max_generations_per_commit=4))
    entry = TableDue("s3://b/t", ("merge", "gc"), 7, options, name="t")
    text = batch_to_json([entry])
    assert "storage" not in text and "secret" not in text
    (back, per_job), = batch_from_json(text)
    assert (back.uri, back.jobs, back.bytes, back.name) == ("s3://b/t", ("merge", "gc"), 7, "t")
    assert per_job["merge"].merge.max_generations_per_commit == 4
    assert per_job["gc"] == JobOptions()


@pytest.mark.parametrize("text, match", [
    ("not json", "not JSON"),
    ('{"format": 9, "tables": []}', "expected"),
    ('{"format": 1, "tables": [{"uri": 3, "jobs": []}]}', r"tables\[0\]"),
    ('{"format": 1, "tables": [{"uri": "/t/x", "jobs": [{"job": "vacuum"}]}]}', "table /t/x: bad job entry"),
    ('{"format": 1, "tables": [{"uri": "/t/x", "jobs": [{"job": "merge", "args": ["--max-generations-per-commit",'
     ' "0"]}]}]}', "table /t/x: merge"),
])
def test_a_bad_batch_file_is_named(text, match):
    with pytest.raises(BadInputError, match=match):
        batch_from_json(text)


# --- running a batch -----------------------------------------------------------------------------------------


def _tables(tmp_path, n: int):
    from support.locations import Location

    locs = [Location("local", str(tmp_path / f"t{i}"), None) for i in range(n)]
    for loc in locs:
        build_table(loc, regions=1, generations=2)
    return locs


def test_a_batch_runs_each_tables_due_jobs_in_order_and_isolates_a_failure(tmp_path):
    locs = _tables(tmp_path, 3)
    expected = [sorted_rows(LsmReader(loc.uri).scan()) for loc in locs]
    probed = [probe_table(loc.uri) for loc in locs]
    entries = [from_probe(r) for r in probed]
    assert all(e is not None and e.jobs == ("merge", "snapshot") and e.bytes > 0 for e in entries)
    missing = TableDue(str(tmp_path / "gone"), ("merge", "gc"), name="gone")
    calls: list[tuple[str, str]] = []

    def run_one(job, table, options):
        calls.append((table.uri, job))
        if table.uri == entries[1].uri and job == "merge":
            raise OSError("injected: the object store refused the merge")
        return in_process(job, table, options)

    results = run_batch([entries[0], entries[1], missing, entries[2]], run_one, open_table=MemWalTable)
    assert [r["status"] for r in results] == ["ok", "failed", "failed", "ok"]
    failed = results[1]
    assert failed["failed_job"] == "merge" and failed["ran"] == []
    assert failed["skipped"] == list(entries[1].jobs[1:]), "the table's later jobs wait for its merge"
    assert entries[1].uri in failed["error"] and "merge" in failed["error"] and "injected" in failed["error"]
    assert results[2]["failed_job"] == "merge" and "gone" in results[2]["error"]
    for i in (0, 2):
        uri = entries[i].uri
        assert [j for u, j in calls if u == uri] == list(entries[i].jobs), "every due job, in the safe order"
        r = results[0 if i == 0 else 3]
        assert r["ran"] == list(entries[i].jobs) and r["summaries"]["merge"]["generations_merged"] == 2
        assert sorted_rows(open_base(locs[i]).to_table()) == expected[i]
    assert not set(probe_table(locs[0].uri).jobs) & set(entries[0].jobs), "what was due is done"


def test_a_job_reporting_failed_regions_stops_the_tables_later_jobs(tmp_path):
    entry = TableDue("/t/x", ("merge", "snapshot"))

    def run_one(job, table, options):
        return {"job": job, "failed_regions": ["r1"], "regions": [{"region_id": "r1", "error": "boom"}]}

    (result,) = run_batch([entry], run_one, open_table=lambda uri: object())
    assert (result["status"], result["failed_job"], result["skipped"]) == ("partial", "merge", ["snapshot"])
    assert "r1: boom" in result["error"] and result["ran"] == ["merge"]


def test_every_key_of_a_table_result_is_documented():
    from tests.library.test_json_contract import _undocumented, contract_table

    doc = contract_table()["fleet"]
    (result,) = run_batch([TableDue("/t/x", ("gc",))], lambda *a: {"job": "gc"}, open_table=lambda uri: object())
    assert _undocumented(result, doc["tables"]) == []
    summary = {**batch_summary([result], 2.0), "spark_master": "local", "spark_application_id": "app",
               "spark_session_s": 1.0}  # the Spark keys spark_jobs/fleet.py adds
    assert _undocumented(summary, doc[None]) == []
    assert json.loads(json.dumps(result)) == result


def test_only_gc_and_retention_due_needs_no_spark():
    assert not TableDue("/t/x", ("gc", "retention")).needs_spark
    assert TableDue("/t/x", ("snapshot", "gc")).needs_spark and TableDue("/t/x", ("merge",)).needs_spark
