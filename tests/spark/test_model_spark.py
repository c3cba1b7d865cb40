"""A smaller set of the model-based sequences with every merge deduplicated on Spark (spark_dedup: one
Spark job per planning round, through `.batch`): on a classic session, and on a Spark Connect session
(the spark_connect engine's executor path)."""

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
    _model_on(spark, tmp_path, capsys, EXAMPLES, "spark")


def test_lsm_model_with_spark_connect_merges(connect_server, tmp_path, capsys):
    from spark_jobs.connect import open_session

    with open_session(connect_server.url) as session:
        _model_on(session, tmp_path, capsys, CONNECT_EXAMPLES, "spark connect")


CONNECT_EXAMPLES = 4


def _model_on(spark, tmp_path, capsys, examples: int, name: str) -> None:
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
        max_examples=examples, stateful_step_count=STEPS, deadline=None, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]))
    n = machine.stats["sequences"]
    with capsys.disabled():
        print(f"\n[memwal model {name}] {n} sequences (<= {STEPS} steps) in {time.monotonic() - started:.1f}s; "
              f"{calls['generations']} generations deduplicated on Spark for {calls['commits']} region batches "
              f"({calls['jobs']} batch jobs)")
    assert n >= examples
    # Certain, not drawn: every sequence ends with a closing put into each region and a merge_table of it
    # (machine._final_check), so each one deduplicates at least one generation on Spark.
    assert calls["jobs"] >= n and calls["generations"] >= n, "every sequence must really merge through Spark"
