"""The fragment apply's per-process dataset cache (memwal.merge_apply._dataset): keyed by the table's
content (`content_id`) and the caller's storage options, so a recreated table or another caller's
credentials never get a dataset opened for something else, while a job's tasks still share one open."""

from __future__ import annotations

import shutil
import uuid

import pytest

from memwal import merge_apply
from memwal.merge import MergeConfig, merge_table
from memwal.table import MemWalTable

from support.apply_runner import use_fragment_apply
from support.maintenance import write_generations
from support.open_counts import count_opens
from support.tables import create_base, open_base, rows, view


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    monkeypatch.setattr(merge_apply, "_open_cache", {})
    use_fragment_apply(monkeypatch)


@pytest.fixture(params=["index", "scan"])
def lookup_path(request, monkeypatch) -> str:
    monkeypatch.setattr(merge_apply, "use_index", lambda ds, keys, pk=(): request.param == "index")
    return request.param


def _build_and_merge(loc, tag: str) -> dict:
    """Table: ids 0..9 ('base'), MemWAL initialized; one region upserts 1 and 2 ('<tag>') and deletes 3;
    merged through the fragment apply. Returns the base table's view."""
    create_base(loc, ids=range(10))
    open_base(loc).initialize_mem_wal(unsharded=True)
    write_generations(loc, str(uuid.uuid4()), [([1, 2], tag, [3])])
    summary = merge_table(MemWalTable(loc.uri, loc.storage_options), config=MergeConfig(apply="fragments"))
    assert not summary.failed_regions, [r.error for r in summary.regions]
    return view(open_base(loc).to_table())


def test_a_table_recreated_at_the_same_uri_and_version_is_merged_from_its_own_files(local_location, lookup_path):
    """Table: built and merged, deleted, built again at the same URI (so the merge reads the same version
    number), merged again in the same process."""
    first = _build_and_merge(local_location, "one")
    shutil.rmtree(local_location.uri)
    second = _build_and_merge(local_location, "two")
    assert first[1][0] == "one1" and second[1][0] == "two1", "the second merge must read the recreated table"
    assert 3 not in second and set(second) == set(range(10)) - {3}


def test_one_jobs_lookup_tasks_open_the_table_once(local_location):
    """Table: ids 0..99; eight lookup tasks at one version in this process: one open between them."""
    create_base(local_location, ids=range(100))
    table = MemWalTable.open(local_location.uri)  # the driver's own open, before counting the tasks'
    upserts = rows(range(0, 80, 2), "u")
    with count_opens(local_location.uri) as counts:
        plan = merge_apply.plan_apply(table, upserts, upserts.select(["id"]).slice(0, 0), parallelism=8)
    assert len(plan.offsets) >= 1 and plan.replacements.num_rows == 40
    assert counts["dataset"] == 1, "the tasks of one job share the dataset (its index pages stay cached)"


def test_other_storage_options_never_get_a_dataset_opened_with_these(s3_location):
    """Table: ids 0..9 on S3 (moto), opened for a task with the right options; the same URI and version
    with options naming an endpoint where nothing listens must open anew (and fail), not reuse it."""
    ds = create_base(s3_location, ids=range(10))
    content = merge_apply.content_id(ds)
    assert content, "pylance tells a version's commit time"
    opts = s3_location.storage_options
    assert merge_apply._dataset(MemWalTable(s3_location.uri, opts), ds.version, content).count_rows() == 10
    assert merge_apply._dataset(MemWalTable(s3_location.uri, dict(opts)), ds.version, content) is \
        merge_apply._dataset(MemWalTable(s3_location.uri, opts), ds.version, content), "equal options share the entry"
    wrong = {**opts, "aws_endpoint": "http://127.0.0.1:9", "connect_timeout": "2s"}
    with pytest.raises((OSError, ValueError), match=r"127\.0\.0\.1:9"):
        merge_apply._dataset(MemWalTable(s3_location.uri, wrong), ds.version, content).count_rows()
