"""Index health (memwal.index_health) read from the manifest equals Lance's index_stats, its thresholds
alert in `memwal status` and the lag breaches, its gauges are emitted; the index policy's CLI options and
tables-file key are validated and reach catch-up."""

from __future__ import annotations

import json

import lance
import pytest

from memwal.catchup import catchup_table
from memwal.cli import main
from memwal.index_health import index_health
from memwal.job_config import JobOptions
from memwal.jobs import EXIT_LAG_ALERT, EXIT_OK, EXIT_USAGE, JOBS, add_common_arguments, add_job_arguments, job_options
from memwal.lag import breaches, measure
from memwal.maintenance_config import IndexPolicy
from memwal.merge import merge_table
from memwal.table import MemWalTable

from support.vector_tables import create_vector_table, write_generation

STATS_FIELDS = {"segments": "num_segments", "indexed_rows": "num_indexed_rows", "unindexed_rows": "num_unindexed_rows",
                "indexed_fragments": "num_indexed_fragments", "unindexed_fragments": "num_unindexed_fragments"}


@pytest.fixture
def table_with_lagging_indexes(local_location):
    """Three segments in the vector index (the base's and one delta per catch-up), deletions in the base
    fragment, and one merge not caught up."""
    loc = local_location
    (region,) = create_vector_table(loc, 3000)
    for c in range(2):
        write_generation(loc, region, range(3000 + 30 * c, 3030 + 30 * c), c + 1, delete_ids=[c, 100 + c])
        merge_table(loc.uri)
        catchup_table(loc.uri, policy=IndexPolicy(max_segments=None))
    write_generation(loc, region, range(4000, 4050), 9, delete_ids=[7])
    merge_table(loc.uri)
    return loc


def test_index_health_equals_index_stats(table_with_lagging_indexes):
    loc = table_with_lagging_indexes
    ds = MemWalTable(loc.uri).refresh().dataset
    health = {h.name: h for h in index_health(ds)}
    assert sorted(health) == ["id_idx", "text_idx", "vec_idx"], "the MemWAL system index is left out"
    for name, h in health.items():
        stats = ds.stats.index_stats(name)
        assert {k: getattr(h, k) for k in STATS_FIELDS} == {k: stats[v] for k, v in STATS_FIELDS.items()}, name
        assert h.index_type == stats["index_type"]
    assert health["vec_idx"].segments == 3 and health["vec_idx"].unindexed_rows == 50
    assert health["vec_idx"].to_dict()["fields"] == ["vec"]


def test_index_thresholds_alert(table_with_lagging_indexes, capsys):
    loc = table_with_lagging_indexes
    summary = measure(loc.uri)
    assert {i["name"]: i["segments"] for i in summary["indexes"]}["vec_idx"] == 3
    found = breaches(summary, {"max_index_segments": 2, "max_unindexed_rows": 49})
    assert sorted(b["key"] for b in found) == ["index:id_idx:unindexed_rows", "index:text_idx:unindexed_rows",
                                               "index:vec_idx:segments", "index:vec_idx:unindexed_rows"]
    assert "index vec_idx: segments 3 > 2" in [b["message"] for b in found]
    assert breaches(summary, {"max_index_segments": 3, "max_unindexed_rows": 50}) == []

    assert main(["status", loc.uri, "--no-health", "--json", "--max-index-segments", "2"]) == EXIT_LAG_ALERT
    out = json.loads(capsys.readouterr().out)
    assert out["alerts"] == ["index vec_idx: segments 3 > 2"]
    assert {i["name"]: i["unindexed_rows"] for i in out["indexes"]}["vec_idx"] == 50
    assert main(["status", loc.uri, "--no-health", "--max-unindexed-rows", "50"]) == EXIT_OK
    assert "index vec_idx (IVF_PQ on vec): 3 segments" in capsys.readouterr().out


def test_index_gauges():
    from memwal.airflow.metrics import lag_metrics

    summary = {"regions": [], "indexes": [{"name": "vec.idx", "segments": 3, "indexed_rows": 10, "unindexed_rows": 2,
                                           "indexed_fragments": 4, "unindexed_fragments": 1}]}
    gauges = {name: (value, tags) for name, value, tags in lag_metrics("t", summary)}
    assert gauges["memwal.t.index.vec_idx.segments"] == (3.0, {"table": "t", "index": "vec.idx"})
    assert gauges["memwal.t.index.vec_idx.unindexed_rows"][0] == 2.0


def _catchup_args(argv):
    import argparse

    parser = argparse.ArgumentParser()
    add_common_arguments(parser, "catchup")
    add_job_arguments(parser, "catchup")
    return job_options("catchup", parser.parse_args(["t", *argv]))


@pytest.mark.parametrize("argv, words", [
    (["--max-segments", "0"], "0 is not >= 1"),
    (["--max-segments", "many"], "'many' is not an integer"),
    (["--max-segments-of", "vec_idx"], "'vec_idx' is not INDEX=N"),
    (["--max-segments-of", "vec_idx=-1"], "-1 is not >= 1"),
])
def test_bad_catchup_options_exit_2_naming_the_option(argv, words, capsys, tmp_path):
    assert main(["catchup", str(tmp_path / "t"), *argv]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert argv[0] in err and words in err and len(err.strip().splitlines()) == 1, err


def test_catchup_options_reach_the_policy_and_round_trip_through_argv():
    options = _catchup_args(["--max-segments", "2", "--max-segments-of", "vec_idx=none", "--max-segments-of", "b=3"])
    assert options.index_policy == IndexPolicy(max_segments=2, max_segments_per_index={"vec_idx": None, "b": 3})
    assert _catchup_args(options.argv("catchup")) == options, "spark-submit gets the same policy"
    assert _catchup_args(["--unbounded-segments"]).index_policy.max_segments is None
    assert _catchup_args([]) == JobOptions() and JobOptions().argv("catchup") == []
    assert "catchup" in JOBS


def test_cli_max_segments_reaches_catch_up(local_location, capsys):
    loc = local_location
    (region,) = create_vector_table(loc, 3000)
    for c in range(3):
        write_generation(loc, region, range(3000 + 30 * c, 3030 + 30 * c), c + 1)
        merge_table(loc.uri)
        assert main(["catchup", loc.uri, "--json", "--max-segments", "2"]) == EXIT_OK
        capsys.readouterr()
    segments = {d.name: len(d.segments) for d in lance.dataset(loc.uri).describe_indices()}
    assert segments["vec_idx"] <= 2, "with the default (4) it would have 3"


@pytest.mark.parametrize("entry, key, words", [
    ({"max_segments": 0}, "index_policy.max_segments", "0 is not >= 1"),
    ({"max_segments": "4"}, "index_policy.max_segments", "is not an integer"),
    ({"max_segments_per_index": {"vec_idx": 0}}, "index_policy.max_segments_per_index", "index 'vec_idx': 0 is not"),
    ({"max_segments_per_index": [1]}, "index_policy.max_segments_per_index", "is not a mapping"),
    ({"max_segment": 3}, "index_policy.max_segment", "unknown key"),
])
def test_tables_file_index_policy_is_validated(entry, key, words):
    from memwal.airflow.config import parse_tables

    good, bad = parse_tables({"tables": {"fine": {"uri": "/t", "index_policy": {"max_segments": 2,
                                                                                "max_segments_per_index": {"v": None}}},
                                         "broken": {"uri": "/t", "index_policy": entry}}}, "tables.yaml")
    assert good["fine"].index_policy == IndexPolicy(max_segments=2, max_segments_per_index={"v": None})
    assert good["fine"].to_dict()["index_policy"] == {"max_segments": 2, "max_segments_per_index": {"v": None}}
    message = str(bad["broken"])
    assert f"table 'broken', key '{key}'" in message and words in message, message


def test_tables_file_index_thresholds_parse():
    from memwal.airflow.config import parse_tables

    good, bad = parse_tables({"tables": {"a": {"uri": "/t", "thresholds": {"max_index_segments": 4,
                                                                           "max_unindexed_rows": 100000}},
                                         "b": {"uri": "/t", "thresholds": {"max_index_segments": -1}}}}, "t.yaml")
    assert good["a"].thresholds.max_index_segments == 4 and good["a"].thresholds.max_unindexed_rows == 100000
    assert bad["b"].key == "thresholds.max_index_segments"


def test_the_page_reads_index_health_with_the_tables_thresholds(table_with_lagging_indexes):
    from memwal.airflow.config import TableConfig, Thresholds
    from memwal.airflow.ui.regions import index_rows
    from memwal.airflow.ui.sources import table_status

    loc = table_with_lagging_indexes
    cfg = TableConfig(name="t", uri=loc.uri, thresholds=Thresholds(max_index_segments=2))
    status, _ = table_status(cfg)
    rows = {r["name"]: r for r in index_rows(status, cfg.thresholds)}
    assert rows["vec_idx"]["segments"] == 3 and rows["vec_idx"]["over"] == ["segments"]
    assert rows["id_idx"]["over"] == [] and rows["id_idx"]["unindexed_rows"] == 50


def test_index_health_opens_no_index_file(table_with_lagging_indexes):
    """Read from the manifest alone: with every index file gone, index_stats fails and index_health does not."""
    import shutil

    loc = table_with_lagging_indexes
    ds = MemWalTable(loc.uri).refresh().dataset
    before = [h.to_dict() for h in index_health(ds)]
    shutil.rmtree(f"{loc.uri}/_indices")
    ds = lance.dataset(loc.uri)
    with pytest.raises(Exception, match="Not found"):
        ds.stats.index_stats("vec_idx")
    assert [h.to_dict() for h in index_health(ds)] == before
