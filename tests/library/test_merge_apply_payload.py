"""What travels to the fragment apply's tasks: metadata (paths, fragment ids, a task's own key slice), never
the commit's upserts, also when the dedup returned them in memory (in process, or the Spark dedup's small
batches)."""

from __future__ import annotations

import pickle
import uuid

import pytest

from memwal import merge_apply
from memwal.merge import MergeConfig, merge_table

from support.apply_runner import pickling_runner, use_fragment_apply
from support.maintenance import write_generations
from support.tables import create_base, open_base, view

UPSERTS = range(500, 20_500)  # 20,000 rows in memory (the in-process dedup), 1,500 of them in the base
KEY_BYTES = 8 * len(UPSERTS)


@pytest.mark.parametrize("path", ["index", "scan"])
def test_inline_upserts_never_travel_whole_to_every_task(local_location, monkeypatch, path):
    """Table: ids 0..1,999 ('base'); one region upserts ids 500..20,499 ('u'), deduplicated in process."""
    monkeypatch.setattr(merge_apply, "use_index", lambda ds, keys, pk=(): path == "index")
    shipped: list[tuple[str, list[int]]] = []

    def runner(fn, tasks):
        shipped.append((fn.__name__, [len(pickle.dumps(t)) for t in tasks]))
        return pickling_runner(fn, tasks)

    use_fragment_apply(monkeypatch, runner, parallelism=2)
    create_base(local_location, ids=range(2_000))
    open_base(local_location).initialize_mem_wal(unsharded=True)
    write_generations(local_location, str(uuid.uuid4()), [(list(UPSERTS), "u", [])])
    summary = merge_table(local_location.uri, config=MergeConfig(apply="fragments"))
    assert not summary.failed_regions, summary
    limit = KEY_BYTES // 2 + 16 * 1024  # a task's even share of the keys, and metadata
    for name, sizes in shipped:
        assert max(sizes) <= limit, f"a {name} task pickle of {max(sizes)} bytes carries more than its own inputs"
    assert {n for n, _ in shipped} >= ({"scan_apply"} if path == "scan" else {"lookup_addresses"})
    want = {i: (f"base{i}", i / 2) for i in range(2_000)} | {i: (f"u{i}", i / 2) for i in UPSERTS}
    assert view(open_base(local_location).to_table()) == want
