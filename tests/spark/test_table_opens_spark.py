"""How often a Spark merge's driver opens its table (the executors open generations, not the table)."""

from __future__ import annotations

from maintenance import build_table
from open_counts import count_opens

from spark_jobs import merge as merge_job


def test_spark_merge_opens_the_table_once(spark, local_location, capfd):
    build_table(local_location, regions=2, generations=3)
    with count_opens(local_location.uri) as counts:
        assert merge_job.main([local_location.uri]) == 0
    with capfd.disabled():
        print("Spark merge:", dict(counts))
    assert dict(counts) == {"dataset": 1, "store": 1, "index": 2}, (
        "the driver opens the dataset and the store once and loads the index once per refresh that moved the "
        "version: to plan, then for the upsert pass's progress check after its own delete pass")
