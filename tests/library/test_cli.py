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


def test_the_command_freezes_the_heap_at_exit_instead_of_collecting_it(local_location):
    """A short job's process must not spend its last second in Python's final collection over lance's and
    pyarrow's objects: `memwal` freezes the heap at exit (checked by a handler registered before it, which
    atexit runs after it)."""
    build_table(local_location, regions=1, generations=1)
    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count() > 0))\n"
            "from memwal.cli import main\n"
            f"sys.exit(main(['status', {local_location.uri!r}, '--no-health']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "frozen at exit: True" in out.stdout


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


def _indexed_table(loc, maintained) -> None:
    """Base with BTREE sidx (name), tidx (score) and pk (id, the primary key's); MemWAL maintaining
    `maintained` (None: maintain_all_indexes)."""
    from support.tables import open_base

    ds = create_base(loc)
    ds.create_scalar_index("name", "BTREE", name="sidx")
    ds.create_scalar_index("score", "BTREE", name="tidx")
    ds.create_scalar_index("id", "BTREE", name="pk")
    open_base(loc).initialize_mem_wal(unsharded=True, **({} if maintained is None else
                                                         {"maintained_indexes": maintained}))


def test_indexes_list_add_drop_with_dry_run(local_location, capsys):
    """`memwal indexes`: list, a dry run printing before and after (nothing committed), the change, and the
    way out of a maintained index dropped from the base (listed as such, then dropped)."""
    from support.tables import open_base

    loc = local_location
    _indexed_table(loc, None)
    assert main(["indexes", "list", loc.uri]) == 0
    out = capsys.readouterr().out
    assert "maintained [pk, sidx, tidx] (maintain_all_indexes: every base index)" in out
    assert "the primary key's BTREE pk is maintained implicitly" in out
    version = open_base(loc).version
    assert main(["indexes", "drop", loc.uri, "tidx", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (f"indexes drop on {loc.uri}: would change maintained [pk, sidx, tidx] (maintain_all_indexes: every "
            "base index) -> [sidx]; dry run: nothing committed") in out, out
    assert "note: maintain_all_indexes was set" in out and open_base(loc).version == version
    assert main(["indexes", "drop", loc.uri, "tidx", "--json"]) == 0
    changed = json.loads(capsys.readouterr().out)
    assert changed["changed"] and changed["after"]["maintained_indexes"] == ["sidx"]
    assert changed["table_version"] == version + 1 == open_base(loc).version
    assert main(["indexes", "add", loc.uri, "tidx"]) == 0
    open_base(loc).drop_index("sidx")
    assert main(["indexes", "list", loc.uri]) == 0
    out = capsys.readouterr().out
    assert f"! sidx is maintained but not on the base table: catch-up and flush skip it; remove it with " \
           f"`memwal indexes drop {loc.uri} sidx`" in out, out
    assert main(["indexes", "drop", loc.uri, "sidx"]) == 0
    assert "maintained [sidx, tidx] -> [tidx]" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["add", "nope"], "index 'nope': no such index in table {uri} (its indexes: pk, sidx, tidx)"),
    (["add", "pk"], "index 'pk' of table {uri} is the primary key's BTREE"),
    (["add", "__lance_mem_wal"], "index '__lance_mem_wal' of table {uri} is the MemWAL index itself"),
    (["drop", "tidx"], "index 'tidx' is not maintained by the MemWAL of table {uri} (maintained: sidx)"),
    (["add"], "indexes add needs at least one index NAME"),
    (["list", "sidx"], "indexes list takes no NAME"),
])
def test_indexes_bad_input_exits_2_naming_table_and_index(local_location, capsys, argv, message):
    from support.tables import open_base

    loc = local_location
    _indexed_table(loc, ["sidx"])
    version = open_base(loc).version
    assert main(["indexes", argv[0], loc.uri, *argv[1:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"memwal indexes: error: {message.format(uri=loc.uri)}"), err
    assert open_base(loc).version == version


def test_indexes_json_keys_are_documented(local_location, capsys):
    """Every key `memwal indexes ... --json` prints is in docs/jobs.md's JSON contract table (row `indexes`)."""
    from tests.library.test_json_contract import _undocumented, contract_table

    loc = local_location
    _indexed_table(loc, None)
    doc = contract_table()["indexes"]
    for argv in (["list"], ["add", "sidx", "--dry-run"], ["drop", "tidx"]):
        assert main(["indexes", argv[0], loc.uri, *argv[1:], "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert _undocumented(out, doc[None]) == [], argv
        for key in ("before", "after"):  # documented once, for both: "`before` and `after` (each: ...)"
            assert _undocumented(out[key], doc["after"]) == [], (argv, key)
