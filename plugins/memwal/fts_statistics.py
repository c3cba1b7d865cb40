"""The BM25 statistics of the LSM view, kept per source and combined per snapshot (issue 44).

Each immutable dataset version (a base version, a flushed generation) gets its forward index once
(`SourceTerms`: every row's terms and length, with the source's raw totals), shared by every snapshot that
reads it; a MemTable's is kept for one snapshot. A snapshot's statistics are each source's raw totals minus
its rows that are not their key's newest live version in the view (`dead` positions): a base row whose key a
source above the base holds (found through the base's key index, in time proportional to those keys, not to
the base), a generation's row some newer version or tombstone supersedes. So a snapshot after one more flush
costs the new generation's analysis and the shadow bookkeeping, not a recount of the view. A new base version
(a merge, a delete) is put together from its fragments' analyses, each kept per fragment's data files (which
never change; a later version only adds deletions): it costs the analysis of the fragments it added.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import lance
import numpy as np
import pyarrow as pa

from memwal.fts_tokenizer import TokenizerConfig, analyze
from memwal.newest_version import upper_view
from memwal.search_plan import View, live_addresses, source_at, upper_positions
from memwal.source_cache import identity as source_identity

if TYPE_CHECKING:
    from memwal.reader import LsmReader

__all__ = ["SourceTerms", "ViewTotals", "dead_positions", "source_terms", "view_totals"]

_ADDR, _ID = "_rowaddr", "_rowid"
# SourceTerms of immutable datasets (base versions, generations): (cache_key, column, config, key) -> value.
_TERMS: OrderedDict[tuple, SourceTerms] = OrderedDict()
_TERMS_CACHED = 64  # the base, unmerged and gap generations of a few tables
# Versions of one base kept whole (each about 8 bytes a term occurrence): a merge makes a new one, and a
# reader of an older snapshot rebuilds its version from the fragments' analyses.
_BASE_VERSIONS_CACHED = 2
_TF_CACHED = 64  # per source: term -> frequencies per row
# _FragmentTerms of base fragments: (uri, fragment id, data files, column, config, key) -> value.
_FRAGMENTS: OrderedDict[tuple, _FragmentTerms] = OrderedDict()
_FRAGMENTS_CACHED = 1024
_LOCK = threading.Lock()  # the caches are shared by the threads of a process


@dataclass(frozen=True)
class _FragmentTerms:
    """One fragment's rows analysed, in address order (term occurrence i: row doc[i], term vocab[term[i]]),
    with the number of its rows deleted when it was read (a fragment's deletions only grow: the same count
    means the same rows)."""

    addrs: np.ndarray
    row_ids: np.ndarray
    keys: np.ndarray | None
    doc: np.ndarray
    term: np.ndarray
    vocab: list[str]
    deleted: int

    @classmethod
    def of_table(cls, table: pa.Table, column: str, config: TokenizerConfig, key: str | None, deleted: int
                 ) -> _FragmentTerms:
        addrs = table.column(_ADDR).to_numpy().astype(np.uint64)
        order = np.argsort(addrs, kind="stable")
        a = analyze(table.column(column).take(pa.array(order)), config)
        return cls(addrs[order], table.column(_ID).to_numpy().astype(np.uint64)[order],
                   table.column(key).to_numpy()[order] if key is not None else None,
                   a.doc.astype(np.int32), a.term.astype(np.int32), list(a.vocab), deleted)


class SourceTerms:
    """The terms of every row of one source, rows in address order: a forward index kept per immutable
    dataset version across snapshots, so a query reads term counts instead of re-analysing text, and a
    snapshot's statistics start from the source's raw totals, and the version's dataset object is reused
    (`dataset`). With `key`: the rows' values of that (single,
    integer) primary key column, for the base's shadow lookup."""

    def __init__(self, addrs: np.ndarray, row_ids: np.ndarray, doc: np.ndarray, term: np.ndarray,
                 vocab: list[str], keys: np.ndarray | None, dataset: lance.LanceDataset | None = None):
        # The dataset object read: later snapshots ask the same version through it, so Lance's index and
        # metadata caches (per dataset object) stay warm instead of being loaded again per snapshot.
        self.dataset = dataset
        self.addrs = addrs
        self.row_ids = row_ids
        self.lengths = np.bincount(doc, minlength=len(addrs)).astype(np.int64)
        self.total_terms = int(self.lengths.sum())
        self.docs = int((self.lengths > 0).sum())
        self.doc = doc.astype(np.int32)
        self.term = term.astype(np.int32)
        self.vocab = {t: i for i, t in enumerate(vocab)}
        self._tf: OrderedDict[str, np.ndarray] = OrderedDict()
        self._keys = keys
        self._key_order: tuple[np.ndarray, np.ndarray] | None = None  # positions in key order, their keys

    @classmethod
    def of_table(cls, table: pa.Table, column: str, config: TokenizerConfig, key: str | None = None,
                 dataset: lance.LanceDataset | None = None) -> SourceTerms:
        """The rows of `table` (with `_rowaddr` and `_rowid`) analysed."""
        f = _FragmentTerms.of_table(table, column, config, key, 0)
        return cls(f.addrs, f.row_ids, f.doc, f.term, f.vocab, f.keys, dataset)

    @classmethod
    def combined(cls, parts: list[tuple[_FragmentTerms, np.ndarray | None]], dataset: lance.LanceDataset | None
                 ) -> SourceTerms:
        """Fragments' analyses put together in address order, each restricted to its rows still live (sorted
        positions; None: all of them), their term ids mapped onto one vocabulary."""
        vocab: dict[str, int] = {}
        addrs, row_ids, keys, docs, terms = [], [], [], [], []
        offset = 0
        for part, live in parts:
            ids = np.fromiter((vocab.setdefault(t, len(vocab)) for t in part.vocab), np.int32, len(part.vocab))
            doc, term = part.doc, part.term
            if live is not None:  # occurrences of rows since deleted dropped, the others renumbered
                new_pos = np.full(len(part.addrs), -1, np.int64)
                new_pos[live] = np.arange(len(live))
                doc = new_pos[doc]
                kept = doc >= 0
                doc, term = doc[kept], term[kept]
            rows = np.arange(len(part.addrs)) if live is None else live
            addrs.append(part.addrs[rows])
            row_ids.append(part.row_ids[rows])
            if part.keys is not None:
                keys.append(part.keys[rows])
            docs.append(doc.astype(np.int64) + offset)
            terms.append(ids[term] if len(ids) else term)
            offset += len(rows)

        def join(arrays: list[np.ndarray], dtype: Any) -> np.ndarray:
            return np.concatenate(arrays) if arrays else np.zeros(0, dtype)

        return cls(join(addrs, np.uint64), join(row_ids, np.uint64), join(docs, np.int64), join(terms, np.int32),
                   list(vocab), join(keys, np.int64) if len(keys) == len(parts) and keys else None, dataset)

    def dataset_for(self, ds: Any) -> Any:
        """The dataset object to ask for `ds`'s version: the one this was read from, unless it was moved to
        another version in place since (then `ds` itself)."""
        kept = self.dataset
        return kept if kept is not None and kept.version == ds.version and kept.uri == ds.uri else ds

    def positions(self, addrs: np.ndarray) -> np.ndarray:
        """Positions of the given row addresses (rows of this source)."""
        return np.searchsorted(self.addrs, addrs)

    def tf(self, term: str) -> np.ndarray:
        """How often `term` occurs in each row."""
        with _LOCK:
            tf = self._tf.get(term)
            if tf is not None:
                self._tf.move_to_end(term)
                return tf
        tid = self.vocab.get(term)
        tf = np.zeros(len(self.addrs), np.int32) if tid is None else \
            np.bincount(self.doc[self.term == tid], minlength=len(self.addrs)).astype(np.int32)
        with _LOCK:
            self._tf[term] = tf
            while len(self._tf) > _TF_CACHED:
                self._tf.popitem(last=False)
        return tf

    def holding(self, keys: np.ndarray) -> np.ndarray:
        """Sorted positions of the rows whose key is one of `keys` (needs `key`): binary searches in the key
        order built once, so the cost follows len(keys), not the source's rows."""
        assert self._keys is not None
        with _LOCK:
            if self._key_order is None:
                order = np.argsort(self._keys, kind="stable")
                self._key_order = order, self._keys[order]
            order, ordered = self._key_order
        if len(keys) == 0 or len(order) == 0:
            return np.zeros(0, np.int64)
        lo, hi = np.searchsorted(ordered, keys, "left"), np.searchsorted(ordered, keys, "right")
        counts = hi - lo
        if not counts.any():
            return np.zeros(0, np.int64)
        # Every position in [lo, hi) of each key (a key the base held twice would be found twice).
        starts = np.repeat(lo, counts)
        offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        return np.unique(order[starts + offsets])


def _integer_key(reader: LsmReader) -> str | None:
    """The base's primary key column when it is one integer column (the shadow lookup's fast path)."""
    if len(reader.pk) != 1:
        return None
    return reader.pk[0] if pa.types.is_integer(reader.base.schema.field(reader.pk[0]).type) else None


def source_terms(reader: LsmReader, position: int, column: str, config: TokenizerConfig) -> SourceTerms:
    """The SourceTerms of source `position`, analysed once per dataset version (`dataset_identity.cache_key`:
    a generation's directory is its own URI; a table recreated at the same URI and version is analysed
    anew); a MemTable's, or a version not told apart from a recreated table's, once per snapshot."""
    ds: Any = source_at(reader, position).dataset
    key_column = _integer_key(reader) if position == 0 else None
    identity = source_identity(ds)
    memory = identity is None
    key = (identity or (ds.uri, ds.version), column, config, key_column)
    store: Any = reader.search_cache.setdefault("fts terms", {}) if memory else _TERMS
    with _LOCK:
        value = store.get(key)
        if value is not None:
            if not memory:
                _TERMS.move_to_end(key)
            return value
    columns = [column] + ([key_column] if key_column and key_column != column else [])
    if position == 0 and not memory:
        value = _base_terms(ds, columns, column, config, key_column)
    else:
        value = SourceTerms.of_table(ds.to_table(columns=columns, with_row_address=True, with_row_id=True),
                                     column, config, key_column, ds)
    with _LOCK:
        store[key] = value
        if position == 0 and not memory:  # the base's older versions: rebuilt from _FRAGMENTS if asked again
            older = sorted((k for k in _TERMS if k[0][0] == ds.uri and k[1:] == key[1:] and k[0][1] < ds.version),
                           key=lambda k: k[0][1])
            for k in older[:-(_BASE_VERSIONS_CACHED - 1) or None]:
                del _TERMS[k]
        while not memory and len(_TERMS) > _TERMS_CACHED:
            _TERMS.popitem(last=False)
    return value


def _deleted(fragment: Any) -> int | None:
    """Rows of the fragment deleted (its deletion file's count; None when Lance does not say)."""
    deletion = fragment.metadata.deletion_file
    return 0 if deletion is None else getattr(deletion, "num_deleted_rows", None)


def _base_terms(ds: lance.LanceDataset, columns: list[str], column: str, config: TokenizerConfig,
                key_column: str | None) -> SourceTerms:
    """A base version's SourceTerms from its fragments' analyses, kept per fragment's data files: a fragment
    analysed for an earlier version is reused, restricted to its rows still live when it has deleted more."""
    parts = []
    for fragment in sorted(ds.get_fragments(), key=lambda f: f.fragment_id):
        fkey = (ds.uri, fragment.fragment_id, tuple(d.path for d in fragment.data_files()), column, config,
                key_column)
        deleted = _deleted(fragment)
        with _LOCK:
            part = _FRAGMENTS.get(fkey)
            if part is not None:
                _FRAGMENTS.move_to_end(fkey)
        live = None
        if part is not None and (deleted is None or deleted != part.deleted):
            now = np.sort(fragment.to_table(columns=[], with_row_address=True).column(_ADDR).to_numpy()
                          .astype(np.uint64))
            live = np.searchsorted(part.addrs, now)
            if len(now) and (live[-1] >= len(part.addrs) or not np.array_equal(part.addrs[live], now)):
                part = live = None  # rows the analysis never saw: not the same fragment after all, read anew
        if part is None:
            part = _FragmentTerms.of_table(
                fragment.to_table(columns=columns, with_row_address=True, with_row_id=True), column, config,
                key_column, -1 if deleted is None else deleted)
            with _LOCK:
                _FRAGMENTS[fkey] = part
                while len(_FRAGMENTS) > _FRAGMENTS_CACHED:
                    _FRAGMENTS.popitem(last=False)
        parts.append((part, live))
    return SourceTerms.combined(parts, ds)


def _complement(terms: SourceTerms, live: np.ndarray) -> np.ndarray:
    """Sorted positions of the source's rows whose address is not in `live` (a sorted subset of its rows)."""
    if len(live) == len(terms.addrs):
        return np.zeros(0, np.int64)
    alive = np.zeros(len(terms.addrs), bool)
    alive[terms.positions(live)] = True
    return np.nonzero(~alive)[0]


def _as_base_keys(reader: LsmReader, held: pa.ChunkedArray) -> np.ndarray | None:
    """Keys held above the base in the base key's integer type; None when one does not fit it (then the
    general join decides)."""
    field = reader.base.schema.field(reader.pk[0])
    try:
        return (held if held.type.equals(field.type) else held.cast(field.type)).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def dead_positions(reader: LsmReader, position: int, terms: SourceTerms, view: View) -> np.ndarray:
    """Sorted positions (in `terms`) of source `position`'s rows that are not their key's newest live version
    in the view (the reader's sources plus the gap generations `view`); cached per snapshot."""
    cache = reader.search_cache
    key = ("fts dead", position, view)
    if key not in cache:
        upper = upper_view(reader, [(i, source_at(reader, i)) for i in upper_positions(reader, view)], view)
        if position > 0:
            cache[key] = _complement(terms, upper.live[position])
        elif terms._keys is not None:
            # A base row is dead when a source above the base holds its key (any version, a tombstone too).
            held = _as_base_keys(reader, upper.keys.column(reader.pk[0]))
            cache[key] = terms.holding(held) if held is not None else \
                _complement(terms, live_addresses(reader, view)[0])
        else:  # a composite or non-integer key: the base's keys joined with the keys above it
            cache[key] = _complement(terms, live_addresses(reader, view)[0])
    return cache[key]


@dataclass(frozen=True)
class ViewTotals:
    """BM25's N (live rows with at least one term) and the live rows' total terms (avgdl = terms / N)."""

    terms: int
    docs: int


def view_totals(parts: list[tuple[SourceTerms, np.ndarray]]) -> ViewTotals:
    """The view's totals from each source's raw totals minus its dead rows: (terms, dead positions) per source."""
    terms = docs = 0
    for source, dead in parts:
        gone = source.lengths[dead]
        terms += source.total_terms - int(gone.sum())
        docs += source.docs - int((gone > 0).sum())
    return ViewTotals(terms, docs)

