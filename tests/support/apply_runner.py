"""Test helper: the merge's fragment apply (memwal.merge_apply) with its tasks run as an executor would run
them: function, tasks and results pickled, tasks in reverse order (no reliance on order or shared state)."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any

from memwal import merge as merge_module
from memwal.merge_apply import choose_apply


def pickling_runner(fn: Callable[[Any], Any], tasks: Sequence[Any], /) -> list[Any]:
    blob = pickle.dumps((fn, list(tasks)))
    fn2, tasks2 = pickle.loads(blob)
    results = {i: pickle.dumps(fn2(t)) for i, t in reversed(list(enumerate(tasks2)))}
    return [pickle.loads(results[i]) for i in range(len(tasks2))]


def use_fragment_apply(monkeypatch, runner: Callable = pickling_runner, parallelism: int = 3) -> None:
    """Every merge in this test applies through memwal.merge_apply (whatever MergeConfig.apply says)."""
    monkeypatch.setattr(merge_module, "choose_apply",
                        lambda mode, r=None, p=1: choose_apply("fragments", runner, parallelism))
