"""A smaller set of the model-based sequences with every merge deduplicated on Spark (spark_dedup: one
Spark job per planning round, through `.batch`)."""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from spark_jobs.merge_dedup import spark_dedup

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from machine import local_machine

EXAMPLES, STEPS = 8, 10


def test_lsm_model_with_spark_merges(spark, tmp_path, capsys):
    hook = spark_dedup(spark)
    calls = Counter()

    def counted(refs, pk, schema, store):
        calls["commits"] += 1
        calls["generations"] += len(refs)
        return hook(refs, pk, schema, store)

    def counted_batch(batches, pk, schema, store):  # the path merge_table takes: one Spark job per round
        calls["commits"] += len(batches)
        calls["generations"] += sum(len(refs) for refs in batches)
        calls["jobs"] += 1
        return hook.batch(batches, pk, schema, store)

    counted.batch = counted_batch
    machine = type("SparkLsmMachine", (local_machine(str(tmp_path)),),
                   {"dedup": staticmethod(counted), "stats": Counter()})
    started = time.monotonic()
    run_state_machine_as_test(machine, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]))
    n = machine.stats["sequences"]
    with capsys.disabled():
        print(f"\n[memwal model spark] {n} sequences (<= {STEPS} steps) in {time.monotonic() - started:.1f}s; "
              f"{calls['generations']} generations deduplicated on Spark for {calls['commits']} region batches "
              f"({calls['jobs']} batch jobs)")
    assert n >= EXAMPLES
    # Certain, not drawn: every sequence ends with a closing put into each region and a merge_table of it
    # (machine._final_check), so each one deduplicates at least one generation on Spark.
    assert calls["jobs"] >= n and calls["generations"] >= n, "every sequence must really merge through Spark"
