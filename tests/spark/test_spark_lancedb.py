"""LanceDB 0.40's LSM-written table merged on Spark (local[2]): generations with deletion files (keys
written twice in one generation) read by the executors, through the shuffle (local files) and through one
task per region batch with staged upserts (S3); LanceDB's query() and count_rows() equal the model after
the merge, and LanceDB writes on."""

from __future__ import annotations

import pytest

from spark_jobs import merge_dedup
from spark_jobs.merge_dedup import spark_dedup

from support.lancedb_peer import LanceDbTable, deletion_files, merge_and_maintain, round_batches

pytestmark = pytest.mark.spark


@pytest.mark.parametrize(("where", "path"), [("local", "dedup_shuffle"), ("s3", "dedup_units")])
def test_lancedb_table_merged_on_spark(spark, request, monkeypatch, where, path):
    real = getattr(merge_dedup, path)
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(merge_dedup, path, counted)
    t = LanceDbTable(request.getfixturevalue(f"{where}_location"))
    t.create("bucket")
    t.write_round(round_batches(0))
    assert deletion_files(t), "LanceDB masked keys written twice in one generation"
    # task_bytes=1: every region batch is deduplicated by the shuffle; inline_bytes=0: upserts are staged.
    hook = spark_dedup(spark, inline_bytes=0, **({"task_bytes": 1} if path == "dedup_shuffle" else {}))
    jobs = merge_and_maintain(t, dedup=hook)
    assert calls, f"the merge must really run on Spark ({path})"
    assert jobs["merge"]["generations_merged"] == len(t.flushed_max())
    assert t.query() == t.expected(), "LanceDB's read after the Spark merge equals the model"
    assert t.count_rows() == len(t.model)
    t.write_round(round_batches(1))
    assert t.query() == t.expected(), "LanceDB writes on after the Spark merge"
