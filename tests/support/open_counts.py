"""Test helper: count what a job opens on one table (base-dataset opens, ObjectStore builds, MemWAL index
loads), by wrapping the three entry points in place."""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from unittest import mock

import lance

import memwal.mem_wal_index as mem_wal_index
from memwal.storage import ObjectStore, normalize_uri


@contextmanager
def count_opens(uri: str):
    """Yields a Counter with keys dataset (lance.dataset of the table root), store (ObjectStore of the table
    root) and index (MemWAL index entries read from a table manifest)."""
    root = normalize_uri(uri)
    counts: Counter = Counter()
    real_dataset, real_init, real_read = lance.dataset, ObjectStore.__init__, mem_wal_index._read_entry

    def dataset(path, *args, **kwargs):
        if normalize_uri(str(path)) == root:
            counts["dataset"] += 1
        return real_dataset(path, *args, **kwargs)

    def init(self, path, *args, **kwargs):
        real_init(self, path, *args, **kwargs)
        if self.uri == root:
            counts["store"] += 1

    def read_entry(store, version):
        counts["index"] += 1
        return real_read(store, version)

    with mock.patch.object(lance, "dataset", dataset), mock.patch.object(ObjectStore, "__init__", init), \
            mock.patch.object(mem_wal_index, "_read_entry", read_entry):
        yield counts
