"""The job specs (memwal.job_spec, memwal.job_specs): every format of a job's options is derived from its
fields, so what one format takes the others carry (argv round-trips through argparse; the tables file's keys
and the operator's overrides are the fields that say so)."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from memwal.airflow.config import parse_tables
from memwal.errors import BadInputError
from memwal.job_config import GcConfig, JobOptions, MergeConfig
from memwal.job_specs import SPECS, spec
from memwal.jobs import JOBS, add_job_arguments, job_options
from memwal.maintenance_config import CompactionConfig, IndexPolicy, RetentionConfig

# one non-default value per job, every flag of the job set
CHANGED = {
    "merge": JobOptions(merge=MergeConfig(max_generations_per_commit=3, max_bytes_per_commit=1024, apply="passes"),
                        up_to_generation=7),
    "catchup": JobOptions(indexes=("a", "b"), index_policy=IndexPolicy(max_segments=None,
                                                                       max_segments_per_index={"v": 2, "w": None})),
    "snapshot": JobOptions(inline_threshold=0),
    "gc": JobOptions(gc=GcConfig(keep_manifest_versions=2, grace_period_s=0.0, dry_run=True)),
    "compaction": JobOptions(compaction=CompactionConfig(
        target_rows_per_fragment=10, materialize_deletions_threshold=0.5, max_fragments=3, max_small_fragments=2,
        max_deleted_ratio=0.25, max_tasks_per_round=4, force=True, use_lock=False)),
    "retention": JobOptions(retention=RetentionConfig(older_than_s=60.0, keep_versions=2, delete_unverified=True,
                                                      dry_run=True)),
}


def _parse(job: str, argv: list[str]) -> JobOptions:
    parser = argparse.ArgumentParser()
    add_job_arguments(parser, job)
    return job_options(job, parser.parse_args(argv))


def test_every_job_has_one_spec():
    assert tuple(SPECS) == JOBS
    with pytest.raises(ValueError, match="unknown job 'nope'"):
        spec("nope")


@pytest.mark.parametrize("job", JOBS)
def test_argv_round_trips_through_the_command_line(job):
    assert _parse(job, []) == JobOptions() and JobOptions().argv(job) == [], "defaults: no flags"
    changed = CHANGED[job]
    assert changed.argv(job), "every job has flags"
    assert _parse(job, changed.argv(job)) == changed, "spark-submit's job reads what the caller meant"


def test_a_job_argv_carries_only_its_own_options():
    everything = JobOptions(**{s.section: getattr(CHANGED[job], s.section) for job, s in SPECS.items() if s.section},
                            up_to_generation=7, indexes=("a",), inline_threshold=0)
    for job in JOBS:
        assert _parse(job, everything.argv(job)).argv(job) == everything.argv(job)
    assert "--dry-run" not in everything.argv("merge") and "--force" in everything.argv("compaction")


def test_the_tables_file_takes_the_fields_marked_for_it():
    keys = {job: set(s.table_keys()) for job, s in SPECS.items()}
    assert keys["merge"] == {"max_generations_per_commit", "max_bytes_per_commit", "apply"}
    assert keys["snapshot"] == {"snapshot_inline_threshold"}
    assert keys["gc"] == {"enabled", "keep_manifest_versions", "grace_period_s"}
    assert "delete_unverified" not in keys["retention"] and "force" not in keys["compaction"]
    entry = {"uri": "/t", "max_bytes_per_commit": "1k", "snapshot_inline_threshold": 0,
             "gc": {"enabled": False, "grace_period_s": 5}}
    good, bad = parse_tables({"tables": {"t": entry}}, "src")
    assert not bad
    options = good["t"].job_options()
    assert options.merge.max_bytes_per_commit == 1024 and options.inline_threshold == 0
    assert options.gc == GcConfig(enabled=False, grace_period_s=5.0, dry_run=True), "disabled: a dry run"


def test_operator_overrides_are_the_fields_marked_for_them():
    marked = {job: set(s.operator_fields()) for job, s in SPECS.items()}
    assert marked == {"merge": {"max_generations_per_commit", "max_bytes_per_commit", "up_to_generation"},
                      "catchup": {"indexes"}, "snapshot": set(), "gc": {"dry_run"}, "compaction": {"force"},
                      "retention": {"dry_run"}}
    options = SPECS["merge"].with_overrides(JobOptions(), {"max_bytes_per_commit": 5, "up_to_generation": None})
    assert options.merge.max_bytes_per_commit == 5 and options.up_to_generation is None


@pytest.mark.parametrize("cls", [MergeConfig, GcConfig, CompactionConfig, RetentionConfig, IndexPolicy])
def test_each_checked_field_names_its_section_when_bad(cls):
    checked = [f for f in fields(cls) if f.metadata.get("check")]
    assert checked
    for f in checked:
        with pytest.raises(BadInputError, match=f" {f.name}: "):
            cls(**{f.name: -1})
