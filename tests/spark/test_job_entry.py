"""The Spark jobs' two edges: each job's entry is a typed `run(spark, table, options, regions)` (argv is
parsed only in `main()`), and the job's arguments on spark-submit's command line are built in one place
(`application_args`), the same for `memwal --spark` and the Airflow hook's SparkSubmitHook."""

from __future__ import annotations

import importlib
import inspect

import pytest

from memwal.jobs import JOBS
from spark_jobs import common, submit


@pytest.mark.parametrize("job", JOBS)
def test_every_job_entry_is_typed_run_and_main(job):
    module = importlib.import_module(f"spark_jobs.{job}")
    assert list(inspect.signature(module.run).parameters) == ["spark", "table", "options", "regions"], \
        "a job's run takes the session, the handle, the typed options and the regions: no argv, no Namespace"
    assert list(inspect.signature(module.main).parameters) == ["argv"]
    assert not hasattr(module, "build_parser"), "argv is parsed only in main()"


def test_the_command_ends_with_the_application_args():
    """spark_submit_command = spark-submit's own options, the script, then exactly application_args."""
    kwargs = {"storage_options": {"aws_endpoint": "http://x"}, "storage_options_file": "/so.json",
              "regions": ["r1", "r2"], "extra_args": ["--max-generations-per-commit", 4]}
    args = submit.application_args("s3://b/t", **kwargs)
    cmd = submit.spark_submit_command("merge", "s3://b/t", spark_submit="/ss", python="/py", ship_code=False,
                                      **kwargs)
    assert cmd[-len(args) - 1:] == [str(submit.job_script("merge")), *args]
    assert args == ["s3://b/t", "--storage-options-json", "@/so.json", "--storage-option", "aws_endpoint=http://x",
                    "--region", "r1", "--region", "r2", "--max-generations-per-commit", "4"]


def test_application_args_parse_back_to_the_same_job(tmp_path):
    """What the hook hands spark-submit is what the job's main() parses: the table, regions and options."""
    from memwal.job_config import JobOptions

    options = JobOptions()
    region = "6f9619ff-8b86-d011-b42d-00c04fc964ff"
    argv = submit.application_args(str(tmp_path / "t"), regions=[region], extra_args=options.argv("merge"))
    args = common.parse_args("merge", argv)
    assert args.table == str(tmp_path / "t") and args.regions == [region]
    assert args.options.argv("merge") == options.argv("merge")
