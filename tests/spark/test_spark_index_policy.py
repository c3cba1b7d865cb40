"""The catch-up entry point takes the index policy's arguments (what `memwal catchup --spark` and the
Airflow operators pass through spark-submit) and folds by them."""

from __future__ import annotations

import json

import pytest

from memwal.index_segments import segment_counts
from memwal.job_config import JobOptions
from memwal.maintenance_config import IndexPolicy
from memwal.merge import merge_table
from memwal.table import MemWalTable
from spark_jobs import catchup as catchup_job

from support.vector_tables import create_vector_table, write_generation

pytestmark = pytest.mark.spark


def test_catchup_entry_point_folds_by_the_policy_it_is_given(spark, local_location, capfd):
    loc = local_location
    (region,) = create_vector_table(loc, 3000)
    argv = JobOptions(index_policy=IndexPolicy(max_segments=2)).argv("catchup")
    assert argv == ["--max-segments", "2"]
    folded = []
    for c in range(3):
        write_generation(loc, region, range(3000 + 30 * c, 3030 + 30 * c), c + 1)
        merge_table(loc.uri)
        assert catchup_job.main([loc.uri, *argv]) == 0
        out = json.loads(capfd.readouterr().out)
        folded += [i["folded_segments"] for i in out["indexes"] if i["index_name"] == "vec_idx"]
        assert segment_counts(MemWalTable(loc.uri).refresh().dataset)["vec_idx"] <= 2
    assert any(folded), folded
