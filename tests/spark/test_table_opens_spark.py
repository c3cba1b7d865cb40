"""How often a Spark merge's driver opens its table (the executors open generations, not the table)."""

from __future__ import annotations

import pytest

from spark_jobs import merge as merge_job

from support.maintenance import build_table
from support.open_counts import count_opens


@pytest.mark.parametrize("apply", ["passes", "fragments"])
def test_spark_merge_opens_the_table_once(spark, local_location, capfd, apply):
    """The driver opens the dataset and the store once and loads the index once, to plan. Two passes: every
    tombstone of build_table lies above its region's first generation, and the Spark dedup reports each
    region's winners, so the upsert pass goes first at the planned version and the delete pass and marker
    steps check progress right after our own marked commit (no load; deletes first would load it again
    after our Lance delete, tests/library/test_table_opens.py). The fragment apply (the Spark default)
    checks progress at the version it planned."""
    build_table(local_location, regions=2, generations=3)
    with count_opens(local_location.uri) as counts:
        assert merge_job.main([local_location.uri, "--apply", apply]) == 0
    with capfd.disabled():
        print(f"Spark merge ({apply}):", dict(counts))
    assert dict(counts) == {"dataset": 1, "store": 1, "index": 1}, apply
