"""What version retention reads grows linearly with the table's versions (issue 23, item 10): `_versions/`
is listed once by a dry run and never by a real run, a real run opens no older version, a disabled policy
reads nothing, and the JSON summary (the XCom) does not grow with the versions."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import lance

from memwal.retention import RetentionConfig, retain_versions
from memwal.storage import ObjectStore

from support.open_counts import count_opens
from support.tables import create_base, open_base, rows

ALL_OLD = RetentionConfig(older_than_s=0, keep_versions=1)


def _table_with_versions(loc, n: int) -> None:
    """A MemWAL table with n versions (create, MemWAL init, then one append per version)."""
    create_base(loc, ids=range(3))
    open_base(loc).initialize_mem_wal(unsharded=True)
    for i in range(n - 2):
        lance.write_dataset(rows([100 + i]), loc.uri, mode="append")
    assert len(open_base(loc).versions()) == n


@contextmanager
def count_reads() -> Iterator[Counter]:
    """Counts listings per prefix (`list:<prefix>`), the objects they returned (`objects`), and the table
    versions opened by `checkout_version` (`checkout`)."""
    counts: Counter = Counter()
    real_list, real_files, real_checkout = ObjectStore.list, ObjectStore.list_files, lance.LanceDataset.checkout_version

    def listing(real):
        def wrapped(self, prefix, *args, **kwargs):
            out = real(self, prefix, *args, **kwargs)
            counts[f"list:{prefix.rstrip('/')}"] += 1
            counts["objects"] += len(out)
            return out
        return wrapped

    def checkout(self, *args, **kwargs):
        counts["checkout"] += 1
        return real_checkout(self, *args, **kwargs)

    with mock.patch.object(ObjectStore, "list", listing(real_list)), \
            mock.patch.object(ObjectStore, "list_files", listing(real_files)), \
            mock.patch.object(lance.LanceDataset, "checkout_version", checkout):
        yield counts


def _listings(counts: Counter) -> int:
    return sum(v for k, v in counts.items() if k.startswith("list:"))


def test_dry_run_lists_versions_once_and_its_summary_is_bounded(local_location):
    """The dry run of n and 2n old versions: `_versions/` listed once, objects listed linear in the versions,
    the JSON summary the same size (counts, ranges, a bounded sample). Before: one listing of `_versions/`
    per removed version (n^2 objects) and one summary entry per version."""
    n, seen = 25, {}  # both over the sample's 20 entries
    for size in (n, 2 * n):
        loc = local_location.child(f"t{size}")
        _table_with_versions(loc, size)
        with count_reads() as counts:
            summary = retain_versions(loc.uri, RetentionConfig(older_than_s=0, keep_versions=1, dry_run=True))
        assert len(summary.versions_removed) == size - 1 and summary.bytes_removed > 0
        assert counts["list:_versions"] == 1, f"{size} versions: _versions/ listed {counts['list:_versions']} times"
        out = summary.to_dict()
        assert out["removed_ranges"] == [[1, size - 1]] and out["retained_ranges"] == [[size, size]]
        seen[size] = (counts["objects"], len(json.dumps(out)))
    (objects_n, json_n), (objects_2n, json_2n) = seen[n], seen[2 * n]
    assert objects_2n <= 2 * objects_n + 10, f"objects listed grow faster than the versions: {seen}"
    assert json_2n <= json_n + 64 and json_2n < 8192, f"the summary grows with the versions: {seen}"


def test_a_real_run_opens_no_older_version_and_does_not_list_versions(local_location):
    loc = local_location
    _table_with_versions(loc, 30)
    with count_reads() as counts:
        summary = retain_versions(loc.uri, ALL_OLD)
    assert len(summary.versions_removed) == 29
    assert [int(v["version"]) for v in open_base(loc).versions()] == [30]
    assert counts["checkout"] == 0, f"a real run opened {counts['checkout']} older versions"
    assert counts["list:_versions"] == 0 and summary.bytes_removed > 0, "bytes_removed is Lance's count"


def test_a_disabled_policy_reads_nothing(local_location):
    loc = local_location
    _table_with_versions(loc, 10)
    with count_reads() as counts, count_opens(loc.uri) as opens:
        summary = retain_versions(loc.uri, RetentionConfig(enabled=False, older_than_s=0, keep_versions=1))
    assert _listings(counts) == 0 and counts["checkout"] == 0 and opens["dataset"] == 0, (counts, opens)
    out = summary.to_dict()
    assert not out["enabled"] and out["num_versions_removed"] == 0 and out["versions_sample"] == []
    assert len(open_base(loc).versions()) == 10
