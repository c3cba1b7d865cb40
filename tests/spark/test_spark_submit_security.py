"""What `memwal <job> --spark` and spark_jobs.submit hand to spark-submit, checked with a recording stand-in
(no Spark is started): storage secrets reach the job in a private file, never on its command line
(issue 23, item 7), and the code zip shipped with --py-files cannot be planted by another user (item 9)."""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from memwal.cli import main
from spark_jobs import submit

from support.maintenance import build_table

SECRET = "canary-5ecret-value-item7"

# The stand-in spark-submit: records its argv and, for `--storage-options-json @FILE`, the file's content and
# the modes of the file and its directory, then prints a merge summary as the job would.
FAKE_SPARK_SUBMIT = """#!{python}
import json, os, stat, sys
argv = sys.argv[1:]
seen = {{"argv": argv, "options": None}}
if "--storage-options-json" in argv:
    ref = argv[argv.index("--storage-options-json") + 1]
    seen["options_ref"] = ref
    if ref.startswith("@"):
        path = ref[1:]
        seen["options"] = json.load(open(path))
        seen["file_mode"] = stat.S_IMODE(os.stat(path).st_mode)
        seen["dir_mode"] = stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode)
json.dump(seen, open({record!r}, "w"))
print(json.dumps({{"job": "merge", "failed_regions": [], "regions": []}}))
"""


@pytest.fixture
def fake_spark(tmp_path, monkeypatch):
    """SPARK_HOME with a recording bin/spark-submit; returns a function reading what it recorded."""
    home = tmp_path / "spark-home"
    (home / "bin").mkdir(parents=True)
    record = tmp_path / "spark-submit-record.json"
    script = home / "bin" / "spark-submit"
    script.write_text(FAKE_SPARK_SUBMIT.format(python=sys.executable, record=str(record)))
    script.chmod(0o755)
    monkeypatch.setenv("SPARK_HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return lambda: json.loads(record.read_text())


@pytest.mark.parametrize("how", ["--storage-option", "--storage-options-json @FILE"])
def test_memwal_spark_passes_storage_secrets_in_a_private_file_not_on_argv(tmp_path, fake_spark, capsys, how):
    table = tmp_path / "table.lance"
    # A MemWAL table with a generation to merge: a merge with nothing to do would not start Spark at all
    # (memwal.engines), and bad input (no table) is refused before spark-submit.
    build_table(SimpleNamespace(uri=str(table), storage_options=None), regions=1, generations=1)
    options = {"aws_secret_access_key": SECRET, "aws_access_key_id": "AKIAITEM7", "aws_region": "eu-west-1"}
    if how == "--storage-option":
        extra = [a for k, v in options.items() for a in ("--storage-option", f"{k}={v}")]
    else:
        given = tmp_path / "mine.json"
        given.write_text(json.dumps(options))
        extra = ["--storage-options-json", f"@{given}"]
    assert main(["merge", str(table), "--spark", "--json", *extra]) == 0, capsys.readouterr().err
    seen = fake_spark()
    assert not any(SECRET in a or "AKIAITEM7" in a for a in seen["argv"]), seen["argv"]
    assert seen["options"] == options, "the job must still get every storage option"
    assert seen["file_mode"] == 0o600 and seen["dir_mode"] == 0o700, "only we can read the file or its directory"
    path = Path(seen["options_ref"][1:])
    assert not path.exists() and not path.parent.exists(), "the file and its directory are removed after the job"
    assert SECRET not in capsys.readouterr().err


def test_run_spark_job_removes_the_options_file_when_spark_submit_fails(tmp_path):
    fake = tmp_path / "spark-submit"
    record = tmp_path / "ref"
    fake.write_text(f'#!/bin/sh\nfor a; do echo "$a"; done > {record}\necho "memwal-gc: error: boom" >&2\nexit 1\n')
    fake.chmod(0o755)
    with pytest.raises(submit.SparkJobError, match="boom"):
        submit.run_spark_job("gc", str(tmp_path), spark_submit=str(fake), ship_code=False,
                             storage_options={"aws_session_token": SECRET})
    argv = record.read_text().splitlines()
    ref = argv[argv.index("--storage-options-json") + 1]
    assert SECRET not in "\n".join(argv) and not Path(ref[1:]).parent.exists()


def test_the_command_builder_refuses_a_secret_on_argv():
    with pytest.raises(ValueError, match="aws_secret_access_key"):
        submit.spark_submit_command("gc", "s3://b/t", spark_submit="/ss", ship_code=False,
                                    storage_options={"aws_secret_access_key": SECRET})
    cmd = submit.spark_submit_command("gc", "s3://b/t", spark_submit="/ss", ship_code=False,
                                      storage_options={"aws_region": "eu-west-1"}, storage_options_file="/so.json")
    assert cmd[-4:] == ["--storage-options-json", "@/so.json", "--storage-option", "aws_region=eu-west-1"]


# --- item 9: the code zip ---------------------------------------------------------------------------------

def _planted_zip(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("memwal/__init__.py", "raise SystemExit('planted')\n")
        zf.writestr("spark_jobs/__init__.py", "")


def _holds_this_code(path: str) -> bool:
    import memwal

    with zipfile.ZipFile(path) as zf:
        return zf.read("memwal/__init__.py") == Path(memwal.__file__).read_bytes()


def test_a_planted_code_zip_is_never_shipped(tmp_path, monkeypatch):
    """Another user's file at the zip's name in the shared temp directory (the old place) or in our cache
    directory (the new one) is not what --py-files ships."""
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    name = Path(submit.package_code()).name  # the content-addressed name of this code
    places = [shared / name, tmp_path / "cache" / "memwal" / name]
    for p in places:
        p.parent.mkdir(parents=True, exist_ok=True)
        _planted_zip(p)
    shipped = submit.package_code()
    assert _holds_this_code(shipped), f"{shipped} is the planted zip"
    assert Path(shipped).parent == tmp_path / "cache" / "memwal"
    cmd = submit.spark_submit_command("gc", "s3://b/t", spark_submit="/ss")
    assert cmd[cmd.index("--py-files") + 1] == shipped


def test_the_cache_directory_is_private_and_an_unsafe_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = Path(submit.package_code())
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    path.parent.chmod(0o777)
    with pytest.raises(PermissionError, match="mode 777 lets others write"):
        submit.package_code()
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o1777)
    with pytest.raises(PermissionError, match=str(open_dir)):
        submit.package_code(str(open_dir))


def test_a_failed_zip_write_leaves_no_tmp_file(tmp_path, monkeypatch):
    def fail(*_args, **_kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(zipfile.ZipFile, "write", fail)
    monkeypatch.setattr(zipfile.ZipFile, "writestr", fail)
    with pytest.raises(OSError, match="disk full"):
        submit.package_code(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_old_code_zips_are_pruned(tmp_path):
    now = time.time()
    old = [tmp_path / f"memwal-code-{i:016x}.zip" for i in range(5)]
    for age, p in enumerate(old, start=2):  # 2..6 days old, newest first
        _planted_zip(p)
        os.utime(p, (now - age * 86400, now - age * 86400))
    recent = tmp_path / "memwal-code-ffffffffffffffff.zip"  # another version, in use an hour ago
    _planted_zip(recent)
    os.utime(recent, (now - 3600, now - 3600))
    stale_tmp = tmp_path / "memwal-code-0000000000000000.zip.1234.tmp"  # a killed build's
    stale_tmp.write_bytes(b"partial")
    os.utime(stale_tmp, (now - 7 * 86400, now - 7 * 86400))
    current = Path(submit.package_code(str(tmp_path)))
    # kept: this code's zip, the newest two others (CODE_ZIPS_KEPT = 3), and anything used within a day
    assert sorted(tmp_path.iterdir()) == sorted([current, recent, old[0]])
