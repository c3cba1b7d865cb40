"""A batch of small tables' due jobs in one Spark application (spark_jobs/fleet.py, spark_jobs/fleet_runners.py):
in the session's SparkSession, through one real spark-submit, and what a recording stand-in of spark-submit is
handed (storage secrets in a private file, never on argv or in the batch file)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from memwal.fleet_batch import TableDue, from_probe
from memwal.probe import probe_table
from memwal.reader import LsmReader
from spark_jobs import fleet
from spark_jobs.fleet_runners import run_fleet_connect, run_fleet_submit

from support.maintenance import build_table
from support.tables import open_base, sorted_rows


def _tables(tmp_path, n: int):
    from support.locations import Location

    locs = [Location("local", str(tmp_path / f"t{i}"), None) for i in range(n)]
    for loc in locs:
        build_table(loc, regions=1, generations=2)
    return locs


def _due(locs) -> tuple[list[TableDue], list]:
    expected = [sorted_rows(LsmReader(loc.uri).scan()) for loc in locs]
    entries = [from_probe(probe_table(loc.uri)) for loc in locs]
    assert all(e is not None and e.jobs == ("merge", "snapshot") for e in entries)
    return entries, expected


def test_a_batch_of_three_tables_runs_in_one_session_and_a_missing_table_fails_alone(spark, tmp_path):
    locs = _tables(tmp_path, 3)
    entries, expected = _due(locs)
    missing = TableDue(str(tmp_path / "gone"), ("merge", "snapshot"), name="gone")
    printed = []
    results = fleet.run(spark, [entries[0], missing, entries[1], entries[2]], on_result=printed.append)
    assert printed == results
    assert [r["status"] for r in results] == ["ok", "failed", "ok", "ok"]
    assert results[1]["failed_job"] == "merge" and "gone" in results[1]["error"]
    assert results[1]["skipped"] == ["snapshot"]
    for loc, want, r in zip(locs, expected, [results[0], *results[2:]], strict=True):
        assert r["ran"] == ["merge", "snapshot"] and r["summaries"]["merge"]["generations_merged"] == 2
        assert "spark_dedup" in r["summaries"]["merge"], "the merge ran its Spark entry point"
        assert sorted_rows(open_base(loc).to_table()) == want


def test_one_spark_submit_application_runs_the_whole_batch(tmp_path):
    locs = _tables(tmp_path, 3)
    entries, expected = _due(locs)
    missing = TableDue(str(tmp_path / "gone"), ("merge",), name="gone")
    summary = run_fleet_submit([*entries, missing], master="local[1]",
                               conf={"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}, timeout=300)
    assert summary["job"] == "fleet" and summary["spark_application_id"]
    assert [r["status"] for r in summary["tables"]] == ["ok", "ok", "ok", "failed"]
    assert summary["failed_tables"] == [missing.uri] and summary["jobs_run"] == 6
    for loc, want in zip(locs, expected, strict=True):
        assert sorted_rows(open_base(loc).to_table()) == want


def test_a_batch_on_one_spark_connect_session(connect_server, tmp_path):
    """The path the hook's spark_connect engine takes (kept to one table: the other tests cover batches)."""
    locs = _tables(tmp_path, 1)
    entries, expected = _due(locs)
    summary = run_fleet_connect([TableDue(str(tmp_path / "gone"), ("merge",)), entries[0]], connect_server.url)
    assert summary["spark_connect_url"] == connect_server.url
    assert [r["status"] for r in summary["tables"]] == ["failed", "ok"] and summary["jobs_run"] == 2
    assert sorted_rows(open_base(locs[0]).to_table()) == expected[0]


# --- what spark-submit is handed (a recording stand-in; no Spark) --------------------------------------------

SECRET = "canary-fleet-5ecret"

FAKE_SPARK_SUBMIT = """#!{python}
import json, os, stat, sys
argv = sys.argv[1:]
ref = argv[argv.index("--storage-options-json") + 1]
batch = argv[argv.index("--storage-options-json") - 1]
seen = {{"argv": argv, "options": json.load(open(ref[1:])), "batch": open(batch).read(),
         "modes": [stat.S_IMODE(os.stat(p).st_mode) for p in (ref[1:], batch, os.path.dirname(batch))]}}
json.dump(seen, open({record!r}, "w"))
print(json.dumps({{"job": "fleet", "tables": [], "failed_tables": [], "jobs_run": 0}}))
"""


def test_the_batchs_storage_secrets_reach_the_driver_in_a_private_file_only(tmp_path, monkeypatch, caplog):
    home = tmp_path / "spark-home"
    (home / "bin").mkdir(parents=True)
    record = tmp_path / "record.json"
    script = home / "bin" / "spark-submit"
    script.write_text(FAKE_SPARK_SUBMIT.format(python=sys.executable, record=str(record)))
    script.chmod(0o755)
    monkeypatch.setenv("SPARK_HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    options = {"aws_secret_access_key": SECRET, "aws_region": "us-east-1"}
    caplog.set_level("INFO")
    summary = run_fleet_submit([TableDue("s3://b/t1", ("merge",)), TableDue("s3://b/t2", ("gc",))],
                               storage_options=options)
    seen = json.loads(record.read_text())
    assert summary["job"] == "fleet" and seen["options"] == options
    assert SECRET not in " ".join(seen["argv"]) and SECRET not in seen["batch"] and SECRET not in caplog.text
    assert json.loads(seen["batch"])["tables"][1]["uri"] == "s3://b/t2"
    assert seen["modes"] == [0o600, 0o600, 0o700], "the options and batch files, and their directory, are private"
    batch_file = Path(seen["argv"][seen["argv"].index("--storage-options-json") - 1])
    assert not batch_file.parent.exists(), "the private directory is removed when spark-submit ends"


def test_a_bad_batch_file_exits_2_before_any_spark_starts(tmp_path, monkeypatch, capfd):
    bad = tmp_path / "batch.json"
    bad.write_text(json.dumps({"format": 1, "tables": [{"uri": "/t/x", "jobs": [{"job": "vacuum"}]}]}))
    result = tmp_path / "result.json"
    monkeypatch.setenv("MEMWAL_RESULT_FILE", str(result))

    def no_spark(*args, **kwargs):
        raise AssertionError("a Spark session was started for a bad batch file")

    monkeypatch.setattr(fleet.common, "build_spark", no_spark)
    assert fleet.main([str(bad)]) == 2
    assert "memwal-fleet: error: batch file: table /t/x: bad job entry" in capfd.readouterr().err
    assert json.loads(result.read_text())["exit"] == 2
    assert fleet.main([str(tmp_path / "missing.json")]) == 2
