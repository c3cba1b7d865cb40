"""The tables configuration (memwal.airflow.config): the shipped file, defaults, relative paths, the
Variable override, and one clear error per bad entry naming the table and the key."""

from __future__ import annotations

import json

import pytest

from memwal.airflow.config import (
    DEFAULT_TABLES_FILE,
    TableConfigError,
    get_table,
    load_tables,
    load_tables_and_errors,
    parse_tables,
)
from memwal.airflow.planning import backfill_chunks, region_batches
from memwal.lag import THRESHOLD_KEYS, validate_thresholds


def test_shipped_file_has_the_demo_table_under_the_repository_demo_dir(monkeypatch):
    monkeypatch.delenv("MEMWAL_TABLES_FILE", raising=False)
    monkeypatch.delenv("AIRFLOW_VAR_MEMWAL_TABLES", raising=False)
    demo = load_tables(use_variable=False)["demo"]
    assert demo.uri == str(DEFAULT_TABLES_FILE.parents[1] / "demo" / "table.lance")
    assert demo.engine == "spark_connect" and demo.spark_conn_id == "memwal_spark_local"
    assert demo.thresholds.max_unmerged_generations == 4, "the table's value over defaults"
    assert demo.thresholds.max_snapshot_age_s == 7200, "nested defaults merge key by key"
    assert demo.max_bytes_per_commit == 512 * 1024 * 1024


def test_env_file_and_variable_override(tmp_path, monkeypatch):
    path = tmp_path / "t.yaml"
    path.write_text("tables:\n  orders: {uri: data/orders.lance, engine: spark, max_merge_applications: 3}\n")
    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(path))
    monkeypatch.setenv("AIRFLOW_VAR_MEMWAL_TABLES", json.dumps(
        {"tables": {"orders": {"engine": "in_process", "thresholds": {"max_index_lag": 3}}}}))
    assert get_table("orders", use_variable=False).engine == "spark"
    orders = get_table("orders")
    assert orders.engine == "in_process" and orders.thresholds.max_index_lag == 3, "the Variable overrides"
    assert orders.max_merge_applications == 3, "keys the Variable does not set come from the file"
    assert orders.uri == str(tmp_path / "data" / "orders.lance"), "relative to the tables file"


@pytest.mark.parametrize("entry, key, words", [
    ({"uri": "/t", "engine": "sparky"}, "engine", "'sparky' is not one of in_process, spark, spark_connect, auto"),
    ({"uri": "/t", "schedule": "every minute"}, "schedule", "not a cron expression"),
    ({"uri": "/t", "max_bytes_per_commit": "lots"}, "max_bytes_per_commit", "is not a size"),
    ({"uri": "/t", "apply": "rows"}, "apply", "must be one of auto, passes, fragments, not 'rows'"),
    ({"uri": "/t", "thresholds": {"max_unmerged_gens": 3}}, "thresholds.max_unmerged_gens", "unknown key"),
    ({"uri": "/t", "gc": {"enabled": "yes"}}, "gc.enabled", "not true or false"),
    ({"uri": "/t", "spark_conf": {"executor.memory": "4g"}}, "spark_conf", "not a Spark property"),
    ({"uri": "/t", "tablename": "x"}, "tablename", "unknown key"),
    ({"engine": "spark"}, "uri", "missing"),
    ({"uri": "gs://bucket/t"}, "uri", "use a path, file:// or s3://"),
])
def test_a_bad_entry_names_the_table_and_the_key_and_the_others_stay(entry, key, words):
    good, bad = parse_tables({"tables": {"fine": {"uri": "/fine"}, "broken": entry}}, "tables.yaml")
    assert list(good) == ["fine"]
    message = str(bad["broken"])
    assert f"table 'broken', key '{key}'" in message and words in message, message
    assert "\n" not in message


def test_unknown_table_lists_the_configured_ones(tmp_path, monkeypatch):
    path = tmp_path / "t.yaml"
    path.write_text("tables:\n  a: {uri: /a}\n  b: {uri: /b}\n")
    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(path))
    with pytest.raises(TableConfigError, match=r"table 'c': no such table .*configured: a, b"):
        get_table("c", use_variable=False)


def test_a_broken_file_is_one_error_naming_it(tmp_path, monkeypatch):
    path = tmp_path / "t.yaml"
    path.write_text("tables: [unclosed\n")
    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(path))
    with pytest.raises(TableConfigError, match="not valid YAML") as exc:
        load_tables_and_errors(use_variable=False)
    assert str(path) in str(exc.value)
    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(tmp_path / "missing.yaml"))
    with pytest.raises(TableConfigError, match="tables file not found"):
        load_tables(use_variable=False)


def test_region_batches_bound_applications_and_balance_bytes():
    pending = [{"region_id": f"r{i}", "generations": [1], "bytes": b} for i, b in enumerate([90, 10, 50, 40, 30])]
    batches = region_batches(pending, 2)
    assert len(batches) == 2 and sorted(r for b in batches for r in b) == [f"r{i}" for i in range(5)]
    sizes = sorted(sum(p["bytes"] for p in pending if p["region_id"] in b) for b in batches)
    assert sizes == [100, 120], "largest first into the lightest batch"
    assert region_batches(pending[:1], 4) == [["r0"]], "never more batches than regions"
    assert region_batches([], 4) == []
    broken = {"region_id": "rx", "generations": [], "bytes": 0, "error": "generation 3 is not in the manifest"}
    assert region_batches([broken], 2) == [["rx"]], "an unreadable region is merged too, so its merge reports it"


def test_backfill_chunks_bound_generations_and_bytes():
    pending = [{"region_id": "a", "generations": [3, 4, 5, 6, 7], "generation_bytes": [10, 10, 50, 10, 10], "rows": 50}]
    by_gens = backfill_chunks(pending, 2, None)
    assert [c["generations"] for c in by_gens] == [[3, 4], [5, 6], [7, 7]]
    by_bytes = backfill_chunks(pending, None, 30)
    assert [c["generations"] for c in by_bytes] == [[3, 4], [5, 5], [6, 7]], "an oversized generation goes alone"
    assert all(c["regions"] == ["a"] for c in by_bytes)


def test_retention_and_compaction_policies_parse_with_the_library_defaults(tmp_path):
    from memwal.airflow.config import parse_tables
    from memwal.maintenance_config import CompactionConfig, RetentionConfig

    good, bad = parse_tables({"tables": {
        "a": {"uri": "/t"},
        "b": {"uri": "/t", "retention": {"older_than_s": 0, "keep_versions": 3},
              "compaction": {"target_rows_per_fragment": 1000, "max_tasks_per_round": 2, "enabled": False}},
        "c": {"uri": "/t", "retention": {"keep_versions": 0}},
        "d": {"uri": "/t", "compaction": {"max_deleted_ratio": 3}},
        "e": {"uri": "/t", "retention": {"keep": 3}},
    }}, "tables.yaml")
    assert good["a"].retention == RetentionConfig() and good["a"].compaction == CompactionConfig()
    assert good["b"].retention.keep_versions == 3 and good["b"].retention.older_than_s == 0
    assert good["b"].compaction.max_tasks_per_round == 2 and not good["b"].compaction.enabled
    assert good["b"].to_dict()["retention"]["keep_versions"] == 3
    assert bad["c"].key == "retention.keep_versions"
    assert bad["d"].key == "compaction.max_deleted_ratio"
    assert bad["e"].key == "retention.keep" and "unknown key" in str(bad["e"])


NUMERIC_KEYS = [
    "max_generations_per_commit", "max_bytes_per_commit", "max_merge_applications", "snapshot_inline_threshold",
    "lag_poll_interval_s", "gc.keep_manifest_versions", "gc.grace_period_s", "retention.older_than_s",
    "retention.keep_versions", "compaction.target_rows_per_fragment", "compaction.materialize_deletions_threshold",
    "compaction.max_fragments", "compaction.max_small_fragments", "compaction.max_deleted_ratio",
    "compaction.max_tasks_per_round", *(f"thresholds.{k}" for k in (
        "max_unmerged_generations", "max_unmerged_bytes", "max_oldest_unmerged_age_s", "max_index_lag",
        "max_snapshot_age_s", "max_fragments", "max_small_fragments", "max_deleted_ratio", "max_table_versions",
        "max_mem_wal_bytes", "max_index_segments", "max_unindexed_rows")),
]


def _entry(key: str, value) -> dict:
    outer, _, inner = key.rpartition(".")
    return {"uri": "/t", **({outer: {inner: value}} if outer else {key: value})}


@pytest.mark.parametrize("text", [".inf", "-.inf", ".nan"])
@pytest.mark.parametrize("key", NUMERIC_KEYS)
def test_non_finite_numbers_are_refused_naming_the_key(key, text):
    """YAML's .inf / .nan are not settings (a NaN grace period disabled failed-flush cleanup)."""
    import yaml

    good, bad = parse_tables({"tables": {"t": _entry(key, yaml.safe_load(text))}}, "tables.yaml")
    assert not good and bad["t"].key == key, (key, text, good)
    assert "\n" not in str(bad["t"]) and "table 't'" in str(bad["t"])


# The command line's options and the tables file's keys for the same setting.
SAME_SETTING = [
    ("merge", "--max-generations-per-commit", "max_generations_per_commit"),
    ("merge", "--max-bytes-per-commit", "max_bytes_per_commit"),
    ("snapshot", "--inline-threshold", "snapshot_inline_threshold"),
    ("gc", "--keep-manifest-versions", "gc.keep_manifest_versions"),
    ("gc", "--grace-period-s", "gc.grace_period_s"),
    ("retention", "--older-than-s", "retention.older_than_s"),
    ("retention", "--keep-versions", "retention.keep_versions"),
    *(("compaction", "--" + k.replace("_", "-"), f"compaction.{k}") for k in (
        "target_rows_per_fragment", "materialize_deletions_threshold", "max_fragments", "max_small_fragments",
        "max_deleted_ratio", "max_tasks_per_round")),
    ("status", "--max-unmerged-generations", "thresholds.max_unmerged_generations"),
    ("status", "--max-age-s", "thresholds.max_oldest_unmerged_age_s"),
    ("status", "--max-index-lag", "thresholds.max_index_lag"),
    ("status", "--max-fragments", "thresholds.max_fragments"),
    ("status", "--max-deleted-ratio", "thresholds.max_deleted_ratio"),
    ("status", "--max-table-versions", "thresholds.max_table_versions"),
    ("status", "--max-index-segments", "thresholds.max_index_segments"),
    ("status", "--max-unindexed-rows", "thresholds.max_unindexed_rows"),
]
VALUES = [-100, -5, -1, 0, 1, 5, 100, 10**6, -0.0, 0.5, 1.5, 2.5, 3e9, 1e11, float("inf"), float("-inf"), float("nan")]


@pytest.mark.parametrize(("job", "option", "key"), SAME_SETTING, ids=[o for _, o, _ in SAME_SETTING])
def test_the_command_line_and_the_tables_file_accept_the_same_values(job, option, key):
    """One check (memwal.option_values) behind both: a value one accepts, the other accepts."""
    from memwal.cli import _parse

    differ = []
    for value in VALUES:
        try:
            _parse([job, "/t", option, str(value)])
            cli_ok = True
        except SystemExit as exc:
            assert exc.code == 2
            cli_ok = False
        good, _ = parse_tables({"tables": {"t": _entry(key, value)}}, "tables.yaml")
        if cli_ok != bool(good):
            differ.append(f"{value!r}: command line {'accepts' if cli_ok else 'refuses'}, tables file "
                          f"{'accepts' if good else 'refuses'}")
    assert not differ, differ
@pytest.mark.parametrize("key", THRESHOLD_KEYS)
def test_the_lag_checks_accept_exactly_what_the_tables_file_accepts(key):
    """`memwal.lag.validate_thresholds` (the sensor's own thresholds, the triggers' kwargs) is the tables
    file's check: no NaN, no infinity, nothing negative; the refusal names the key."""
    differ = []
    for value in [*VALUES, "512MiB", True, None]:
        try:
            validate_thresholds({key: value}, "sensor s thresholds")
            lag_ok = True
        except ValueError as exc:
            assert f"sensor s thresholds: threshold {key!r}: " in str(exc), str(exc)
            lag_ok = False
        good, _ = parse_tables({"tables": {"t": _entry(f"thresholds.{key}", value)}}, "tables.yaml")
        if lag_ok != bool(good):
            differ.append(f"{value!r}: lag check {'accepts' if lag_ok else 'refuses'}, tables file "
                          f"{'accepts' if good else 'refuses'}")
    assert not differ, differ
    for bad in (float("nan"), float("inf"), -1):
        with pytest.raises(ValueError, match=f"threshold '{key}'"):
            validate_thresholds({key: bad})


def test_the_sensor_and_the_triggers_refuse_a_non_finite_or_negative_threshold():
    from memwal.airflow.sensors.memwal import MemWalLagSensor
    from memwal.airflow.triggers.memwal import MemWalLagEventTrigger, MemWalLagTrigger

    with pytest.raises(ValueError, match="s thresholds: threshold 'max_index_segments': nan is not an integer"):
        MemWalLagSensor(task_id="s", table="t", thresholds={"max_index_segments": float("nan")})
    with pytest.raises(ValueError, match="threshold 'max_unindexed_rows': -1 is not >= 0"):
        MemWalLagEventTrigger(table="t", table_uri="/t", thresholds={"max_unindexed_rows": -1})
    with pytest.raises(ValueError, match="threshold 'max_snapshot_age_s': inf is not a finite number"):
        MemWalLagTrigger(table="t", table_uri="/t", thresholds={"max_snapshot_age_s": float("inf")})


def test_the_tables_index_policy_reaches_the_catchup_operator():
    from memwal.airflow.operators.memwal import MemWalCatchupOperator
    from memwal.maintenance_config import IndexPolicy

    good, _ = parse_tables({"tables": {"v": {"uri": "/t", "index_policy": {"max_segments": 2},
                                             "compaction": {"max_small_fragments": 3}}}}, "tables.yaml")
    options = MemWalCatchupOperator(task_id="c", table="v").job_options(good["v"])
    assert options.index_policy == IndexPolicy(max_segments=2)
    assert options.compaction.max_small_fragments == 3, "catch-up folds for compaction by the table's rules"
    assert options.argv("catchup") == ["--max-segments", "2"], "the spark engine passes it to spark-submit"


def test_the_tables_apply_reaches_the_merge_job():
    """`apply` in the tables file: the merge operator's options carry it, and the spark engine passes it to
    spark-submit, which parses it back (`memwal.jobs`)."""
    import argparse

    from memwal.airflow.operators.memwal import MemWalMergeOperator
    from memwal.jobs import add_common_arguments, add_job_arguments, job_options

    good, _ = parse_tables({"tables": {"m": {"uri": "/t", "apply": "fragments"}, "d": {"uri": "/t"}}}, "tables.yaml")
    options = MemWalMergeOperator(task_id="m", table="m").job_options(good["m"])
    assert options.merge.apply == "fragments" and options.argv("merge") == ["--apply", "fragments"]
    parser = argparse.ArgumentParser()
    add_common_arguments(parser, "merge")
    add_job_arguments(parser, "merge")
    assert job_options("merge", parser.parse_args(["/t", *options.argv("merge")])).merge.apply == "fragments"
    assert MemWalMergeOperator(task_id="d", table="d").job_options(good["d"]).argv("merge") == [], "auto: no flag"
