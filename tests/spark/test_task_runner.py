"""The Spark TaskRunner: each task runs as its own Spark task and the results come back in task order,
equal to the in-process runner's."""

from __future__ import annotations

import os
import pickle

import pytest

from memwal.task_runner import in_process
from spark_jobs.task_runner import spark_runner

pytestmark = pytest.mark.spark


def test_results_come_back_in_task_order_and_equal_the_in_process_runner(spark):
    def _where(task: tuple[int, str]) -> tuple[int, str, int]:  # a closure: pickled by value for the workers
        n, text = task
        return n * n, text.upper(), os.getpid()

    tasks = [(n, f"t{n}") for n in range(7, 0, -1)]
    on_spark = spark_runner(spark, "test")(_where, tasks)
    here = in_process(_where, tasks)
    assert [r[:2] for r in on_spark] == [r[:2] for r in here], "same results, in task order"
    assert {r[2] for r in on_spark} != {os.getpid()}, "the tasks ran in Spark's Python workers, not the driver"


def test_a_failing_task_fails_the_run(spark):
    def _boom(task: int) -> int:
        if task == 2:
            raise ValueError("task 2 failed")
        return task

    with pytest.raises(Exception, match="task 2 failed"):
        spark_runner(spark)(_boom, [1, 2, 3])
    assert spark_runner(spark)(_boom, []) == []


def test_each_spark_task_receives_only_its_own_tasks_pickle(spark):
    """Seven tasks on local[2] (more than the cores): each runs as its own Spark task, whose input is its
    own pickle; the closure every task deserializes holds the function only."""

    def _seen(task: bytes) -> tuple[int, int]:
        from pyspark import TaskContext

        return TaskContext.get().partitionId(), len(task)

    tasks = [bytes([n]) * (100_000 + n) for n in range(7)]
    run = spark_runner(spark, "test")
    seen = run(_seen, tasks)
    assert [n for _, n in seen] == [len(t) for t in tasks], "each task got its own input"
    assert len({p for p, _ in seen}) == len(tasks), "one Spark task per task"
    assert run.stats["closure_bytes"] < 100_000, "no task's input travels in the closure"
    assert run.stats["task_bytes"] == [len(pickle.dumps(t)) for t in tasks]
