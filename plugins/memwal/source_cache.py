"""What a search reads of an immutable source, kept across snapshots: a flushed generation never changes, nor
does a base version, so its keys, index descriptions and statistics and its vectors are read once per process
rather than once per reader. A table taking streaming writes gets a new snapshot at every flush; its first
search then reads only the new generation (bench/search.py, "a new snapshot's first search").

Keyed by the dataset's content (`dataset_identity.cache_key`: URI, version, manifest commit time), so a table
recreated at the same URI is read anew; a MemTable (an in-memory dataset) or a version that cannot be told apart
is not kept here (the reader's per-snapshot cache keeps it). Bounded by bytes, least recently used first out.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import lance
import numpy as np
import pyarrow as pa

from memwal.dataset_identity import cache_key

__all__ = ["cached", "clear", "identity", "nbytes", "peek"]

T = TypeVar("T")

# The generations above the base of a few busy tables, their vectors included (5,000 rows x 128 float32 are
# 2.6 MB a generation); MEMWAL_SOURCE_CACHE_BYTES sets it, 0 turns the cache off.
DEFAULT_BYTES = 512 << 20
_LOCK = threading.Lock()
_ENTRIES: OrderedDict[tuple, tuple[Any, int]] = OrderedDict()
_SIZE = [0]


def _limit() -> int:
    try:
        return int(os.environ.get("MEMWAL_SOURCE_CACHE_BYTES", DEFAULT_BYTES))
    except ValueError:
        return DEFAULT_BYTES


def identity(ds: lance.LanceDataset) -> tuple[str, int, int] | None:
    """The dataset's content identity, or None when it is not to be kept across snapshots (in memory, or a
    version not told apart from a recreated table's)."""
    return None if ds.uri.startswith("memory://") else cache_key(ds)


def nbytes(value: Any) -> int:
    """Bytes a cached value holds (Arrow tables and arrays, numpy arrays, and tuples, lists, dicts and objects'
    attributes of them, as a bloom filter's words; anything else counts a little)."""
    if isinstance(value, (pa.Table, pa.Array, pa.ChunkedArray, pa.RecordBatch)):
        return int(value.nbytes)
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (tuple, list)):
        return sum(nbytes(v) for v in value) + 64
    if isinstance(value, dict):
        return sum(nbytes(v) for v in value.values()) + 64
    if hasattr(value, "__dict__"):
        return sum(nbytes(v) for v in vars(value).values()) + 64
    return sys.getsizeof(value)


def cached(ds: lance.LanceDataset, what: Hashable, make: Callable[[], T]) -> T:
    """make() once per (content of `ds`, what) in this process; made anew each call for a dataset that has no
    identity (the caller keeps it per snapshot)."""
    found = identity(ds)
    limit = _limit()
    if found is None or limit <= 0:
        return make()
    key = (found, what)
    with _LOCK:
        hit = _ENTRIES.get(key)
        if hit is not None:
            _ENTRIES.move_to_end(key)
            return hit[0]
    value = make()
    size = nbytes(value)
    with _LOCK:
        if key not in _ENTRIES and size <= limit:
            _ENTRIES[key] = (value, size)
            _SIZE[0] += size
            while _SIZE[0] > limit:
                _, (_, freed) = _ENTRIES.popitem(last=False)
                _SIZE[0] -= freed
    return value


def peek(ds: lance.LanceDataset, what: Hashable) -> Any | None:
    """What `cached` keeps for (content of `ds`, what), or None; made by no one."""
    found = identity(ds)
    if found is None:
        return None
    with _LOCK:
        hit = _ENTRIES.get((found, what))
    return None if hit is None else hit[0]


def clear() -> None:
    """Forget everything kept (tests, and a process that wants the memory back)."""
    with _LOCK:
        _ENTRIES.clear()
        _SIZE[0] = 0
