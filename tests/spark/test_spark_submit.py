"""Real spark-submit runs of spark_jobs/merge.py: local[2], a standalone cluster, a table on S3 (moto), and
jobs that fail. The last (only) stdout line is the JSON summary; the table afterwards equals the LSM view
before the merge."""

from __future__ import annotations

import json
import subprocess

import pytest
from spark_helpers import Loc, base_rows, build_table, lsm_view

from memwal.mem_wal_index import load_index
from spark_jobs import submit
from spark_jobs.merge_dedup import STAGING_DIR

from support.jvm import FAST_JVM
from support.s3_decoy import NOT_REACHED, S3_REMOVALS, s3_options_without
from support.tables import create_base

pytestmark = pytest.mark.spark

# Per region (spark_helpers.GENS): newest versions are puts for 1, 2, 3, 12, 20..59 and tombstones for
# 4, 5, 11, 13.
UPSERTS_PER_REGION, DELETES_PER_REGION = 44, 4


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env=submit.spark_submit_env(), timeout=300)


def _assert_merged(summary: dict, loc, regions: list[str], before: list[dict]) -> None:
    assert summary["job"] == "merge" and summary["failed_regions"] == []
    by_region = {r["region_id"]: r for r in summary["regions"]}
    assert sorted(by_region) == sorted(regions)
    for r in by_region.values():
        assert r["generations"] == [1, 2, 3, 4, 5] and r["merged_generation_after"] == 5
        assert (r["rows_upserted"], r["rows_deleted"]) == (UPSERTS_PER_REGION, DELETES_PER_REGION)
        assert r["rows_read"] >= r["rows_upserted"] + r["rows_deleted"] and r["commits"] == 1
    assert summary["generations_merged"] == 5 * len(regions)
    assert summary["rows_upserted"] == UPSERTS_PER_REGION * len(regions)
    assert base_rows(loc) == before, "the base table after the merge must equal the LSM view before it"
    assert load_index(loc.uri, loc.storage_options).merged_generations == dict.fromkeys(regions, 5)
    assert loc.store().list(STAGING_DIR) == []


def test_spark_submit_merge_local(tmp_path):
    loc = Loc(str(tmp_path / "table"))
    regions = build_table(loc)
    before = lsm_view(loc)
    cmd = submit.spark_submit_command("merge", loc.uri, master="local[2]", conf=FAST_JVM,
                                      extra_args=["--log-level", "DEBUG"])
    assert cmd[-3:] == [loc.uri, "--log-level", "DEBUG"] and cmd[-4].endswith("/spark_jobs/merge.py")
    proc = _run(cmd)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, f"stdout must be exactly the summary line, got {proc.stdout[:2000]!r}"
    summary = json.loads(lines[0])
    assert summary["spark_master"] == "local[2]"
    _assert_merged(summary, loc, regions, before)
    assert "memwal.merge: region" in proc.stderr, "progress goes to stderr, with timestamps"


def test_spark_submit_merge_on_a_standalone_cluster(standalone_master, tmp_path):
    loc = Loc(str(tmp_path / "table"))
    regions = build_table(loc)
    before = lsm_view(loc)
    summary = submit.run_spark_job(
        "merge", loc.uri, master=standalone_master,
        conf={**FAST_JVM, "spark.executor.memory": "512m", "spark.driver.host": "127.0.0.1"},
    )
    assert summary["spark_master"] == standalone_master
    assert summary["spark_application_id"].startswith("app-"), "it must run on the cluster, not locally"
    _assert_merged(summary, loc, regions, before)


@pytest.mark.s3
def test_spark_submit_merge_on_s3(s3_location):
    loc = s3_location
    regions = build_table(loc)
    before = lsm_view(loc)
    summary = submit.run_spark_job("merge", loc.uri, master="local[2]", storage_options=loc.storage_options,
                                   conf=FAST_JVM)
    assert summary["table_uri"] == loc.uri
    _assert_merged(summary, loc, regions, before)


@pytest.mark.s3
@pytest.mark.parametrize("removed", sorted(S3_REMOVALS))
def test_spark_submit_on_s3_fails_without_the_endpoint_or_keys_it_was_given(s3_location, removed):
    """Positive control of the test above: spark-submit, its driver and executors inherit an environment
    whose S3 is a refusing decoy with no keys, so the job reaches the table only through the options it is
    given; with the endpoint or the keys removed it fails with the reason and changes nothing."""
    loc = s3_location
    regions = build_table(loc)
    before = lsm_view(loc)
    with pytest.raises(submit.SparkJobError, match=NOT_REACHED):
        submit.run_spark_job("merge", loc.uri, master="local[1]", conf=FAST_JVM,
                             storage_options=s3_options_without(loc.storage_options, removed))
    assert lsm_view(loc) == before and load_index(loc.uri, loc.storage_options).merged_generations == {}, regions


def _reason_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("memwal-merge: error: ")]


def test_a_failing_job_exits_non_zero_with_a_one_line_reason(tmp_path):
    proc = _run(submit.spark_submit_command("merge", str(tmp_path / "missing"), master="local[1]", conf=FAST_JVM))
    assert proc.returncode == 2 and proc.stdout == "", "a missing table is bad input: no summary"
    reasons = _reason_lines(proc.stderr)
    assert len(reasons) == 1 and f"table {tmp_path / 'missing'} not found" in reasons[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1] == reasons[0], "the reason is the last thing on stderr"


def test_run_spark_job_raises_with_the_reason(tmp_path, spark, capfd):
    """A table without MemWAL: in process (no second JVM) for the exit status and stderr, and
    run_spark_job's error handling with a stand-in spark-submit that behaves the same way."""
    from spark_jobs import merge as merge_job

    plain = Loc(str(tmp_path / "plain"))
    create_base(plain)
    assert merge_job.main([plain.uri]) == 1
    out, err = capfd.readouterr()
    assert out == "" and len(_reason_lines(err)) == 1 and err.rstrip().splitlines()[-1] == _reason_lines(err)[0]
    reason = _reason_lines(err)[0]
    assert reason.startswith("memwal-merge: error: MemWalNotInitializedError: ") and "no MemWAL index" in reason

    fake = tmp_path / "spark-submit"
    fake.write_text(f"#!/bin/sh\necho 'some log line' >&2\necho '{reason}' >&2\necho 'shutdown' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(submit.SparkJobError) as info:
        submit.run_spark_job("merge", plain.uri, spark_submit=str(fake))
    e = info.value
    assert e.returncode == 1 and e.summary is None and e.reason == reason.split("error: ", 1)[1]
    assert e.reason in str(e) and e.stderr_tail[-1] == "shutdown"

    summary = {"job": "merge", "failed_regions": ["r"], "regions": [{"region_id": "r", "error": "boom"}]}
    fake.write_text(f"#!/bin/sh\necho '{json.dumps(summary)}'\necho 'memwal-merge: error: 1 of 1' >&2\nexit 3\n")
    with pytest.raises(submit.SparkJobError) as info:
        submit.run_spark_job("merge", plain.uri, spark_submit=str(fake))
    assert info.value.returncode == 3 and info.value.summary == summary, "the summary of a partial failure"


def test_spark_submit_command_is_exact(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmd = submit.spark_submit_command(
        "merge", "rel/table", master="spark://h:7077",
        storage_options={"aws_endpoint": "http://x"}, storage_options_file="/so.json", regions=["r1", "r2"],
        extra_args=["--max-generations-per-commit", 4], conf={"spark.executor.memory": "2g"},
        python="/py", spark_submit="/ss", py_files=["/code.zip"], ship_code=False,
    )
    assert cmd == [
        "/ss", "--master", "spark://h:7077", "--name", "memwal-merge",
        "--conf", "spark.pyspark.python=/py", "--conf", "spark.pyspark.driver.python=/py",
        "--conf", f"spark.driver.extraJavaOptions=-Dlog4j2.configurationFile=file:{submit.LOG4J_CONFIG}",
        "--conf", f"spark.executor.extraJavaOptions=-Dlog4j2.configurationFile=file:{submit.LOG4J_CONFIG}",
        "--conf", "spark.executor.memory=2g", "--py-files", "/code.zip",
        str(submit.JOBS_DIR / "merge.py"), str(tmp_path / "rel" / "table"), "--storage-options-json", "@/so.json",
        "--storage-option", "aws_endpoint=http://x", "--region", "r1", "--region", "r2",
        "--max-generations-per-commit", "4",
    ]
    shown = submit.redact([*cmd, "--storage-option", "aws_secret_access_key=s3cr3t"])
    assert "aws_secret_access_key=***" in shown and "aws_endpoint=http://x" in shown and "s3cr3t" not in shown
    with pytest.raises(ValueError):
        submit.spark_submit_command("compact", "t")
    default = submit.spark_submit_command("gc", "s3://b/t")
    assert default[0].endswith("/bin/spark-submit") and default[2] == "local[*]"


def test_package_code_ships_both_packages(tmp_path):
    import zipfile

    path = submit.package_code(str(tmp_path))
    names = zipfile.ZipFile(path).namelist()
    assert {"memwal/merge.py", "memwal/__init__.py", "spark_jobs/merge_dedup.py", "spark_jobs/common.py"} <= set(names)
    assert submit.package_code(str(tmp_path)) == path, "content-addressed: built once"


def test_job_arguments(tmp_path):
    from spark_jobs import common

    secrets = tmp_path / "so.json"
    secrets.write_text(json.dumps({"aws_secret_access_key": "s", "allow_http": True, "aws_region": "x"}))
    region = "6F9619FF-8B86-D011-B42D-00C04FC964FF"
    args = common.parse_args("merge", [
        "s3://b/t", "--storage-options-json", f"@{secrets}", "--storage-option", "aws_region=us-east-1",
        "--region", region, "--region", region.lower(), "--max-bytes-per-commit", "64MiB", "--log-level", "debug",
    ])
    assert args.storage_options == {"aws_secret_access_key": "s", "allow_http": "true", "aws_region": "us-east-1"}
    assert args.regions == [region.lower()], "region ids are normalised UUIDs, deduplicated"
    assert args.max_bytes_per_commit == 64 * 1024 * 1024 and args.log_level == "DEBUG"
    assert args.max_generations_per_commit == 8 and args.up_to_generation is None
    assert common.parse_args("merge", ["t"]).storage_options is None
