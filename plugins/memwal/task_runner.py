"""Where the tasks of a distributed operation run. Every distributed operation has the same three steps
(STYLE: plan on the driver, tasks that own disjoint work and return only metadata, one commit on the driver);
a `TaskRunner` is the middle step: it maps a picklable function over picklable tasks and returns the
results in task order. `in_process` runs them here, one after another; the Spark engines'
(`spark_jobs.task_runner`) run one Spark task each. Nothing here imports Spark.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = ["TaskRunner", "in_process"]


class TaskRunner(Protocol):
    def __call__(self, fn: Callable[[Any], Any], tasks: Sequence[Any], /) -> list[Any]:
        """`[fn(task) for task in tasks]`, wherever the tasks run; an exception of any task is raised."""
        ...


def in_process(fn: Callable[[Any], Any], tasks: Sequence[Any], /) -> list[Any]:
    """Run the tasks here, one after another (each may use Lance's own threads)."""
    return [fn(task) for task in tasks]
