"""LanceDB 0.40's LSM-written table merged on Spark (local[2]), locally and on S3: generations with
deletion files (keys written twice in one generation) read by the executors, through one task per
region batch and through the shuffle; LanceDB's query() and count_rows() equal the model each round."""

from __future__ import annotations

import pytest
from lancedb_peer import LanceDbTable, deletion_files, merge_and_maintain, round_batches

from spark_jobs import merge_dedup
from spark_jobs.merge_dedup import spark_dedup

pytestmark = pytest.mark.spark


def test_lancedb_table_merged_on_spark(spark, location, monkeypatch):
    calls = {"_dedup_units": 0, "_dedup_shuffle": 0}
    for name in calls:
        real = getattr(merge_dedup, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(merge_dedup, name, counted)
    t = LanceDbTable(location)
    t.create("bucket")
    # Round 0: one Spark task per region batch, upserts staged as files; round 1: every batch by shuffle.
    hooks = [("_dedup_units", spark_dedup(spark, inline_bytes=0)),
             ("_dedup_shuffle", spark_dedup(spark, inline_bytes=0, task_bytes=1))]
    for r, (path, hook) in enumerate(hooks):
        t.write_round(round_batches(r))
        assert deletion_files(t), "LanceDB masked keys written twice in one generation"
        before = calls[path]
        jobs = merge_and_maintain(t, dedup=hook)
        assert calls[path] > before, f"round {r}: the merge must really run on Spark ({path})"
        assert jobs["merge"]["generations_merged"] == len(t.flushed_max())
        assert t.query() == t.expected(), f"round {r}: LanceDB's read after the Spark merge equals the model"
        assert t.count_rows() == len(t.model)
