"""The library reaches the executors of a cluster whose Python does not have it: every spark-submit ships
`memwal` and `spark_jobs` with --py-files (spark_jobs.submit.package_code). Executors here run a Python with
every dependency and no memwal (tests/support/python_envs.py), on the standalone cluster of tests/spark."""

from __future__ import annotations

import json
import zipfile

import pytest
from spark_helpers import Loc, build_table, lsm_view

from memwal.cli import main
from spark_jobs import submit

from support.jvm import FAST_JVM
from support.python_envs import imports, python_without_memwal

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def worker_python(tmp_path_factory):
    """The executors' interpreter: dependencies yes, memwal no (asserted: the control of these tests)."""
    root = tmp_path_factory.mktemp("worker-python")
    python = python_without_memwal(root / "venv")
    assert imports(python, "lance", root) and imports(python, "pyspark", root), "the dependencies must import"
    assert not imports(python, "memwal", root) and not imports(python, "spark_jobs", root), \
        "control: the workers' Python must not have memwal"
    return python


def _conf(worker_python) -> dict[str, str]:
    return {**FAST_JVM, "spark.executor.memory": "512m", "spark.driver.host": "127.0.0.1",
            "spark.pyspark.python": str(worker_python)}


def test_memwal_merge_spark_ships_the_code_to_executors_without_it(standalone_master, worker_python, tmp_path,
                                                                   capsys):
    """The CLI's --spark path: executors on a Python without memwal merge every region."""
    loc = Loc(str(tmp_path / "table"))
    regions = build_table(loc)
    before = lsm_view(loc)
    argv = ["merge", loc.uri, "--spark", "--master", standalone_master, "--json"]
    for key, value in _conf(worker_python).items():
        argv += ["--conf", f"{key}={value}"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["spark_application_id"].startswith("app-"), "it must run on the cluster, not locally"
    assert not summary["failed_regions"] and summary["generations_merged"] > 0, summary
    assert sorted(r["region_id"] for r in summary["regions"] if r["generations"]) == sorted(regions)
    assert lsm_view(loc) == before, "the merge kept the rows a reader sees"


def test_without_the_shipped_code_those_executors_fail(standalone_master, worker_python, tmp_path):
    """The counter-proof: the same job with ship_code=False fails on those executors (they lack spark_jobs)."""
    loc = Loc(str(tmp_path / "table"))
    build_table(loc)
    with pytest.raises(submit.SparkJobError) as info:
        submit.run_spark_job("merge", loc.uri, master=standalone_master, conf=_conf(worker_python), ship_code=False)
    text = json.dumps(info.value.summary or {}) + "\n".join(info.value.stderr_tail)
    assert "No module named" in text, text[-3000:]


def test_every_spark_submit_command_ships_the_installed_code(tmp_path):
    cmd = submit.spark_submit_command("gc", "s3://b/t", spark_submit="/ss", py_files=["/extra.zip"])
    zip_path = submit.package_code()
    assert cmd[cmd.index("--py-files") + 1] == f"{zip_path},/extra.zip"
    names = set(zipfile.ZipFile(zip_path).namelist())
    assert {"memwal/_proto/memwal_pb2.py", "spark_jobs/merge_dedup.py", "memwal/merge.py"} <= names
    assert "--py-files" not in submit.spark_submit_command("gc", "s3://b/t", spark_submit="/ss", ship_code=False)
