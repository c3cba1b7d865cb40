"""The read plan's newest-version check (memwal-spec.txt, Indexed Read Plan): is a candidate row its key's
newest live version in the view a search reads?

A row of a generation or MemTable: the winners among the sources above the base (their keys read once per
snapshot and view; newest generation, then row address; a tombstone hides its key). A base row: live unless a
source above the base holds its key. For a search's candidates each generation's bloom filter is asked first
(a certain "no" from every filter clears the candidate without a lookup), then the candidates some filter may
hold are looked up in the keys above the base (those the winners already read: no second read of a
generation's keys). Whole-base questions (full-text statistics, rows no index covers) join the base's keys
with the keys above it; the base's keys are read once per base version. Base rows are taken as unique per key
(the merge keeps them so).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal import naming
from memwal.bloom_filter import BloomFilter, block_positions, key_hashes, read_bloom_filter, trusted_key_type
from memwal.dataset_identity import cache_key
from memwal.dedup import ROWADDR_COLUMN as _ADDR
from memwal.dedup import SOURCE_COLUMN as _SRC
from memwal.errors import CorruptFileError
from memwal.source_cache import cached

if TYPE_CHECKING:
    from memwal.lsm_source import Source
    from memwal.reader import LsmReader

__all__ = ["NewerCheck", "UpperView", "base_keys", "member", "newer_versions", "shadowed_in_bulk", "upper_view"]

log = logging.getLogger(__name__)

Upper = list[tuple[int, "Source"]]  # (reader position, source) of every source above the base in a view
_BASE_KEYS: OrderedDict[tuple[str, int, int], pa.Table] = OrderedDict()  # by cache_key
_BASE_KEYS_CACHED = 2
_LOCK = threading.Lock()
_MARK = "__memwal_upper"


@dataclass
class NewerCheck:
    """What the newest-version check of base candidates cost: (key, generation) pairs a bloom filter ruled
    out, and candidates looked up in the keys above the base (some filter, or a source without one, said maybe)."""

    bloom_skips: int = 0
    key_probes: int = 0


@dataclass(frozen=True)
class UpperView:
    """The sources above the base in one view: per position, the sorted row addresses of the rows that are
    their key's newest live version; and every key they hold (any version, tombstones too)."""

    live: dict[int, np.ndarray]
    keys: pa.Table


def member(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """values[i] in sorted_set, vectorised."""
    if len(sorted_set) == 0:
        return np.zeros(len(values), bool)
    pos = np.minimum(np.searchsorted(sorted_set, values), len(sorted_set) - 1)
    return sorted_set[pos] == values


def upper_view(reader: LsmReader, upper: Upper, key: object) -> UpperView:
    """The UpperView of these sources, computed once per snapshot under `key` (the view's name)."""
    cache = reader.search_cache
    if ("upper", key) not in cache:
        pk = list(reader.pk)
        if upper:
            winners = reader.winners(upper, tombstones=True)
            live = winners.filter(pc.invert(winners.column(naming.TOMBSTONE_COLUMN)))
            src = live.column(_SRC).to_numpy()
            addr = live.column(_ADDR).to_numpy().astype(np.uint64)
            by_position = {i: np.sort(addr[src == i]) for i, _ in upper}
            keys = winners.select(pk)
        else:
            by_position, keys = {}, reader.output_schema(pk).empty_table()
        cache["upper", key] = UpperView(by_position, keys)
    return cache["upper", key]


def shadowed_in_bulk(pk: list[str], keys: pa.Table, upper_keys: pa.Table) -> np.ndarray:
    """Per row of `keys` (the key columns of base rows): whether a source above the base holds that key."""
    if keys.num_rows == 0 or upper_keys.num_rows == 0:
        return np.zeros(keys.num_rows, bool)
    left = keys.select(pk).append_column(_MARK, pa.array(np.arange(keys.num_rows, dtype=np.int64)))
    found = left.join(upper_keys.select(pk), keys=pk, join_type="left semi").column(_MARK).to_numpy()
    out = np.zeros(keys.num_rows, bool)
    out[found] = True
    return out


def base_keys(reader: LsmReader) -> pa.Table:
    """The base version's key columns and `_rowaddr`, read once per base version (shared by readers; keyed by
    `dataset_identity.cache_key`, so a table recreated at the same URI and version is read anew)."""
    ds = reader.base
    key = cache_key(ds)
    if key is None:  # not told apart from a recreated table: kept for this reader only
        if "base keys" not in reader.search_cache:
            reader.search_cache["base keys"] = ds.to_table(columns=list(reader.pk), with_row_address=True)
        return reader.search_cache["base keys"]
    with _LOCK:
        if key in _BASE_KEYS:
            _BASE_KEYS.move_to_end(key)
            return _BASE_KEYS[key]
    keys = ds.to_table(columns=list(reader.pk), with_row_address=True)
    with _LOCK:
        _BASE_KEYS[key] = keys
        while len(_BASE_KEYS) > _BASE_KEYS_CACHED:
            _BASE_KEYS.popitem(last=False)
    return keys


def _bloom(reader: LsmReader, position: int, source: Source) -> BloomFilter | None:
    """The generation's bloom filter when it has one, over a key type whose filters are proven Lance core's
    (bloom_filter.trusted_key_type) and typed as the base types it; cached."""
    key = ("bloom", position)
    cache = reader.search_cache
    if key not in cache:
        found = None
        types = [reader.base.schema.field(c).type for c in reader.pk]
        trusted = trusted_key_type(*types) and [source.dataset.schema.field(c).type for c in reader.pk] == types
        if source.path is not None and source.region_id is not None and trusted:
            try:  # a generation's filter never changes: read once per process (memwal.source_cache)
                found = cached(source.dataset, "bloom filter",
                               lambda: read_bloom_filter(reader.store, source.region_id, source.path))
            except CorruptFileError as e:
                log.warning("region %s generation %d: %s; its keys are checked without it", source.region_id,
                            source.generation, e)
        cache[key] = found
    return cache[key]


def _bloom_stack(reader: LsmReader, upper: Upper, key: object) -> np.ndarray | None:
    """The view's bloom filters as one (sources, blocks, 8) array, so a search's candidates are probed in all
    of them at once; None when a source has none (every candidate is then looked up) or their sizes differ
    (probed one by one). Built once per snapshot and view."""
    cache = reader.search_cache
    if ("bloom stack", key) not in cache:
        blooms = [_bloom(reader, position, source) for position, source in upper]
        stack = None
        if all(b is not None for b in blooms) and len({b.num_blocks for b in blooms}) == 1:
            stack = np.stack([np.frombuffer(b.to_bytes(), "<u4").reshape(b.num_blocks, -1) for b in blooms])
        cache["bloom stack", key] = stack
    return cache["bloom stack", key]


def _maybe_held(reader: LsmReader, upper: Upper, key: object, hashes: np.ndarray, check: NewerCheck | None
                ) -> np.ndarray:
    """Per hashed key: whether some bloom filter of the view may hold it (a source without one: maybe)."""
    n = len(hashes)
    stack = _bloom_stack(reader, upper, key)
    if stack is not None:
        block, masks = block_positions(hashes, stack.shape[1])
        might = ((stack[:, block, :] & masks) == masks).all(axis=2)  # (sources, keys)
        if check is not None:
            check.bloom_skips += int((~might).sum())
        return might.any(axis=0)
    maybe = np.zeros(n, bool)
    for position, source in upper:
        bloom = _bloom(reader, position, source)
        if bloom is None:
            return np.ones(n, bool)
        might = bloom.might_contain_hashes(hashes)
        if check is not None:
            check.bloom_skips += int((~might).sum())
        maybe |= might
    return maybe


def _key_values(keys: pa.Table, pk: list[str]) -> list:
    """The rows of `keys` as Python keys: values (one key column) or tuples."""
    cols = [keys.column(c).to_pylist() for c in pk]
    return cols[0] if len(cols) == 1 else list(zip(*cols, strict=True))


def _held_keys(reader: LsmReader, upper: Upper, key: object) -> frozenset:
    """Every key a source above the base holds in the view `key` (any version), as values (one key column) or
    tuples: from the keys its UpperView already read, built once per snapshot."""
    cache = reader.search_cache
    if ("held", key) not in cache:
        cache["held", key] = frozenset(_key_values(upper_view(reader, upper, key).keys, list(reader.pk)))
    return cache["held", key]


def newer_versions(reader: LsmReader, keys: pa.Table, upper: Upper, key: object, check: NewerCheck | None = None
                   ) -> np.ndarray:
    """Per row of `keys` (base candidates' key columns): whether a source above the base (the view `key`)
    holds that key. Every generation's bloom filter first, all probed at once; only the candidates some filter
    may hold (or a source without one) are looked up in the keys above the base."""
    n = keys.num_rows
    found = np.zeros(n, bool)
    if n == 0 or not upper:
        return found
    pk = list(reader.pk)
    columns = [keys.column(c) for c in pk]
    if trusted_key_type(*(c.type for c in columns)):
        maybe = _maybe_held(reader, upper, key, key_hashes(*columns), check)
    else:
        maybe = np.ones(n, bool)
    if maybe.any():
        held = _held_keys(reader, upper, key)
        values = _key_values(keys, pk)
        if check is not None:
            check.key_probes += int(maybe.sum())
        for i in np.nonzero(maybe)[0]:
            found[i] = values[i] in held
    return found
