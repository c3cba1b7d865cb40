"""The `memwal` command: what operators see and the exit status."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memwal.cli import main

from support.maintenance import build_table
from support.tables import create_base


def test_status_shows_every_region(local_location, capsys):
    ids = build_table(local_location, regions=2, generations=2)
    assert main(["status", local_location.uri]) == 0
    out = capsys.readouterr().out
    assert all(r in out for r in ids) and "unmerged" in out


def test_merge_json_summary_then_status_shows_no_backlog(local_location, capsys):
    build_table(local_location, regions=2, generations=3)
    assert main(["merge", local_location.uri, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["job"] == "merge" and summary["generations_merged"] == 6 and summary["commits"] == 2
    assert main(["status", local_location.uri, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["unmerged_generations"] == 0


def test_gc_dry_run_and_other_jobs_exit_zero(local_location, capsys):
    build_table(local_location, regions=1, generations=2)
    for argv in (["catchup"], ["snapshot"], ["gc", "--dry-run"]):
        assert main([argv[0], local_location.uri, *argv[1:]]) == 0, argv
    assert "dry run" in capsys.readouterr().out


def test_table_without_mem_wal_fails_with_one_line_reason(local_location, capsys):
    create_base(local_location)
    assert main(["merge", local_location.uri]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("memwal merge: ") and "initialise MemWAL" in err[-1]


def test_bad_storage_option_is_named(local_location, capsys):
    assert main(["status", local_location.uri, "--storage-option", "novalue"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "memwal status: error: argument --storage-option: 'novalue' is not KEY=VALUE"]


def test_console_script_is_on_the_venv_path(local_location):
    exe = Path(sys.executable).with_name("memwal")
    build_table(local_location, regions=1, generations=1)
    done = subprocess.run([str(exe), "status", local_location.uri], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "1 regions" in done.stdout


def test_status_lag_thresholds_alert_with_exit_4(local_location, capsys):
    build_table(local_location, regions=2, generations=3)
    assert main(["status", local_location.uri, "--max-unmerged-generations", "3"]) == 0
    assert main(["status", local_location.uri, "--max-unmerged-generations", "2"]) == 4
    err = capsys.readouterr().err
    assert err.count("ALERT region") == 2 and "unmerged_generations 3 > 2" in err
    assert main(["merge", local_location.uri]) == 0
    assert main(["status", local_location.uri, "--max-unmerged-generations", "0", "--max-age-s", "0"]) == 0


def test_a_failed_region_exits_3_after_the_summary(local_location, capsys):
    import shutil

    from memwal import naming
    from memwal.region_manifest import load_latest_manifest

    (region,) = build_table(local_location, regions=1, generations=1)
    gen = load_latest_manifest(local_location.store(), region).flushed_generations[0]
    shutil.rmtree(f"{local_location.uri}/{naming.generation_dir(region, gen.path)}")
    assert main(["merge", local_location.uri, "--region", region, "--json"]) == 3
    captured = capsys.readouterr()
    assert json.loads(captured.out.strip().splitlines()[-1])["failed_regions"] == [region]
    assert captured.err.strip().splitlines()[-1].startswith(f"memwal merge: 1 of 1 region(s) failed: {region}: ")


def test_region_that_is_not_a_uuid_is_a_usage_error(local_location, capsys):
    assert main(["merge", local_location.uri, "--region", "bucket-3"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "memwal merge: error: argument --region: region id 'bucket-3' is not a UUID"]


def test_compaction_and_retention_commands_json_summaries(local_location, capsys):
    """`memwal compaction --force` then `memwal retention`: stable JSON summaries; GC then frees generations."""
    build_table(local_location, regions=2, generations=3)
    assert main(["merge", local_location.uri]) == 0
    capsys.readouterr()
    assert main(["compaction", local_location.uri, "--force", "--target-rows-per-fragment", "1000", "--json"]) == 0
    comp = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert comp["job"] == "compaction" and comp["compacted"] and comp["health_after"]["fragments"] == 1
    assert main(["retention", local_location.uri, "--older-than-s", "0", "--keep-versions", "1", "--dry-run"]) == 0
    assert "retention (dry run): would remove" in capsys.readouterr().out
    assert main(["retention", local_location.uri, "--older-than-s", "0", "--keep-versions", "1", "--json"]) == 0
    ret = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert ret["job"] == "retention" and ret["num_versions_retained"] == 1 and ret["bytes_removed"] > 0
    assert main(["gc", local_location.uri, "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["deleted"]["generation"] == 6


def test_compaction_not_due_and_bad_policy_values(local_location, capsys):
    build_table(local_location, regions=1, generations=1)
    assert main(["compaction", local_location.uri]) == 0
    assert "not due; nothing committed" in capsys.readouterr().out
    assert main(["compaction", local_location.uri, "--max-deleted-ratio", "2"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "memwal compaction: error: argument --max-deleted-ratio: 2.0 is not between 0 and 1"]


def test_spark_runs_are_refused_before_spark_submit_on_bad_input(local_location, tmp_path, capsys, monkeypatch):
    """`--spark` checks the table, region and index in process first: bad input never starts a JVM."""
    import spark_jobs.submit

    monkeypatch.setattr(spark_jobs.submit, "run_spark_job",
                        lambda *a, **k: pytest.fail("spark-submit started on bad input"))
    build_table(local_location, regions=1, generations=1)
    missing = str(tmp_path / "nope.lance")
    unknown = "0b6e5f3c-1111-4222-8333-444455556666"
    for argv, says in ((["merge", missing], f"table {missing} not found"),
                       (["merge", local_location.uri, "--region", unknown], f"--region {unknown}: no such region"),
                       (["catchup", local_location.uri, "--index", "nosuch"], "--index 'nosuch': no such index")):
        assert main([*argv, "--spark"]) == 2, argv
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and says in err[0], err
