"""A merge commit that mixes an inline batch and a staged batch of the Spark dedup (production
`inline_bytes`), applied by the fragment apply on Spark: the commit stays staged, each task's payload is
its own metadata (paths, fragment ids), and the driver never opens the staged batch's upserts."""

from __future__ import annotations

import pickle
import uuid
from types import SimpleNamespace

import pytest

from memwal import merge as merge_module
from memwal import merge_apply
from memwal.merge import MergeConfig, merge_table
from memwal.storage import ObjectStore
from spark_jobs.merge_dedup import DEFAULT_INLINE_BYTES, spark_dedup
from spark_jobs.task_runner import spark_runner

from support.maintenance import write_generations
from support.tables import create_base, open_base, view

pytestmark = pytest.mark.spark

BASE = range(10_000)
SMALL = [1, 2, 3]  # region A: 3 keys, inline
LARGE = range(5_000, 65_000)  # region B: 60,000 rows, 5,000 of them in the base, staged
TAG = "large-region-row-" * 2  # wide enough that region B's generation is over the inline limit
CLOSURE_LIMIT = 64 * 1024  # the closure every task deserializes: the function, no task's input
KEY_BYTES = 8 * (len(SMALL) + len(LARGE))  # the backlog's keys (int64)


def _loc(tmp_path) -> SimpleNamespace:
    loc = SimpleNamespace(uri=str(tmp_path / uuid.uuid4().hex), storage_options=None)
    loc.store = lambda: ObjectStore(loc.uri)
    return loc


class _Recording:
    """The production Spark dedup, recording which batches it staged and any driver open of their upserts."""

    def __init__(self, spark):
        self.base, self.staged, self.opened = spark_dedup(spark), [], []

    def _wrap(self, x):
        if isinstance(x, merge_module.MergeInput):
            self.staged.append(bool(x.staged))
            if x.staged:
                real = x.open_upserts
                x.open_upserts = lambda: self.opened.append(x.staged) or real()
        return x

    def __call__(self, refs, pk, schema, store):
        return self._wrap(self.base(refs, pk, schema, store))

    def batch(self, batches, pk, schema, store):
        return [self._wrap(x) for x in self.base.batch(batches, pk, schema, store)]


@pytest.mark.parametrize("path", ["index", "scan"])
def test_a_mixed_inline_and_staged_commit_ships_each_task_only_its_own_metadata(spark, tmp_path, monkeypatch,
                                                                                 path):
    """Table: ids 0..9,999 ('base'); region A upserts ids 1..3 ('a'), region B upserts ids 5,000..64,999
    (5,000 replaced, 55,000 fresh); one commit carries both (the default budgets)."""
    monkeypatch.setattr(merge_apply, "use_index", lambda ds, keys, pk=(): path == "index")
    loc = _loc(tmp_path)
    create_base(loc, ids=BASE)
    open_base(loc).initialize_mem_wal(unsharded=True)
    write_generations(loc, str(uuid.uuid4()), [(SMALL, "a", [])])
    write_generations(loc, str(uuid.uuid4()), [(list(LARGE), TAG, [])])
    real = spark_runner(spark, "test mixed commit")
    shipped: list[tuple[str, int, list[int]]] = []

    def runner(fn, tasks):
        out = real(fn, tasks)
        shipped.append((fn.__name__, getattr(real, "stats", {}).get("closure_bytes"),
                        [len(pickle.dumps(t)) for t in tasks]))
        return out

    dedup = _Recording(spark)
    summary = merge_table(loc.uri, config=MergeConfig(apply="fragments"), dedup=dedup, runner=runner, parallelism=2)
    assert not summary.failed_regions, summary
    assert summary.table_commits == 2, "one commit (an Update and its marker) carries both regions"
    assert sorted(dedup.staged) == [False, True], (
        f"the case needs one inline and one staged batch under inline_bytes={DEFAULT_INLINE_BYTES}")
    assert not dedup.opened, "the driver opened the upserts of a staged batch"
    task_limit = KEY_BYTES // 2 + 16 * 1024  # a task's even share of the keys (parallelism 2), and metadata
    for name, closure, sizes in shipped:
        assert max(sizes) <= task_limit, (
            f"a {name} task received a {max(sizes)}-byte pickle (limit {task_limit}): more than its own inputs")
        assert closure is not None and closure <= CLOSURE_LIMIT, f"every {name} task deserialized {closure} bytes"
    names = {name for name, _, _ in shipped}
    assert ("scan_apply" if path == "scan" else "apply_fragments") in names, names
    want = {i: (f"base{i}", i / 2) for i in BASE} | {i: (f"a{i}", i / 2) for i in SMALL} | {
        i: (f"{TAG}{i}", i / 2) for i in LARGE}
    assert view(open_base(loc).to_table()) == want
    left = [d for d in loc.store().list_dirs("_mem_wal/_staging") if d.startswith("merge-inline-")]
    assert not left, f"the inline parts' staged file outlived its commit: {left}"
