"""The small sources of a vector search (generations and MemTables of at most FLAT_ROWS rows) as one block:
their live newest rows' vectors in one matrix, built once per snapshot, view and column, so a search of all
of them, filtered or not, is one matrix-vector product and one exact re-rank instead of one search per source.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import lance
import numpy as np
import pyarrow as pa

from memwal.block_pruning import (
    MIN_ROWS,
    Axes,
    Pruning,
    axes_of,
    head_of,
    prunable,
    pruned_rows,
    pruning_of,
    pruning_under,
)
from memwal.newest_version import member
from memwal.search_plan import View, is_live, source_at
from memwal.source_cache import cached, peek

if TYPE_CHECKING:
    from memwal.reader import Filter, LsmReader

__all__ = ["FlatBlock", "block_of", "distances", "flat_block", "flat_top", "has_vector", "matrix", "passing",
           "small_rows"]

_EPS32 = float(np.finfo(np.float32).eps)
# Filters whose passing block rows are kept per reader (a filter string repeated across queries reads the
# small sources once); an expression filter is evaluated per search.
_FILTERS_KEPT = 16


def distances(vectors: np.ndarray, q: np.ndarray, metric: str) -> np.ndarray:
    """Lance's distances: squared L2, 1 - cosine similarity, or 1 - dot product."""
    v = vectors.astype(np.float64)
    q64 = q.astype(np.float64)
    if metric == "cosine":
        norms = np.linalg.norm(v, axis=1) * np.linalg.norm(q64)
        with np.errstate(divide="ignore", invalid="ignore"):
            return 1.0 - (v @ q64) / norms
    if metric == "dot":
        return 1.0 - v @ q64
    return ((v - q64) ** 2).sum(axis=1)


def has_vector(column: pa.ChunkedArray) -> np.ndarray:
    """Which rows of a vector column hold a vector (not a null entry). flatten() drops the null entries, so
    those rows must go, with their addresses, before a column is turned into a matrix (matrix)."""
    return column.is_valid().to_numpy(zero_copy_only=False)


def matrix(column: pa.ChunkedArray, dim: int) -> np.ndarray:
    """The (rows, dim) float32 matrix of a vector column without null entries (has_vector)."""
    return np.asarray(column.combine_chunks().flatten(), np.float32).reshape(-1, dim)


@dataclass(frozen=True)
class FlatBlock:
    """The live newest rows of the small sources of a plan whose distance is defined (a vector, finite, and
    not zero under cosine; the others are never a result), one row per entry: source position, generation,
    row address, vector (float32); and per row the ranking terms of flat_top (squared norm; minus the inverse
    norm under cosine) and the largest norm, all float64; and, for a block large enough, its projected head
    (memwal.block_pruning), which let a query read a fraction of it."""

    positions: np.ndarray
    gens: np.ndarray
    addrs: np.ndarray
    vecs: np.ndarray
    sq: np.ndarray
    neg_inv: np.ndarray
    max_norm: float
    pruning: Pruning | None = None


def _defined(vecs: np.ndarray, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(which rows have a defined distance, their squared norms): finite, and not zero under cosine. The norms
    in float64 without a float64 copy of the rows; a row holding NaN or inf has a non-finite one (float32 values
    squared cannot overflow float64)."""
    sq = np.einsum("ij,ij->i", vecs, vecs, dtype=np.float64) if len(vecs) else np.zeros(0)
    keep = np.isfinite(sq) & ((sq > 0) if metric == "cosine" else True)
    return keep, sq[keep]


def _block(positions: np.ndarray, gens: np.ndarray, addrs: np.ndarray, vecs: np.ndarray, sq: np.ndarray,
           metric: str, pruning: Pruning | None) -> FlatBlock:
    norms = np.sqrt(sq)
    return FlatBlock(positions, gens, addrs, vecs, sq, -1.0 / norms if metric == "cosine" else np.zeros(0),
                     float(norms.max()) if len(norms) else 0.0, pruning)


def block_of(positions: np.ndarray, gens: np.ndarray, addrs: np.ndarray, vecs: np.ndarray, metric: str,
             prune: bool = True) -> FlatBlock:
    """The FlatBlock of these rows (one entry each), without the rows whose distance is undefined; `prune`:
    with its projected head when it is large enough (memwal.block_pruning.MIN_ROWS)."""
    keep, sq = _defined(vecs, metric)
    kept = np.ascontiguousarray(vecs[keep], np.float32)
    return _block(positions[keep], gens[keep], addrs[keep].astype(np.uint64), kept, sq, metric,
                  pruning_of(kept, metric) if prune else None)


@dataclass(frozen=True)
class _Piece:
    """One small source's rows whose distance is defined (`_defined`): row addresses, float32 vectors and
    squared norms. A generation's is made once per process (memwal.source_cache), a MemTable's per snapshot."""

    addrs: np.ndarray
    vecs: np.ndarray
    sq: np.ndarray


def _piece(ds: lance.LanceDataset, column: str, dim: int, metric: str) -> _Piece:
    def read() -> _Piece:
        t = ds.to_table(columns=[column], with_row_address=True)
        t = t.filter(pa.array(has_vector(t.column(column))))
        vecs = matrix(t.column(column), dim)
        keep, sq = _defined(vecs, metric)
        return _Piece(t.column("_rowaddr").to_numpy().astype(np.uint64)[keep],
                      np.ascontiguousarray(vecs[keep], np.float32), sq)

    return cached(ds, ("flat piece", column, dim, metric), read)


# Per table, column, metric and dimension: the axes the blocks' rows are projected on (block_pruning.Axes),
# kept while most of a new snapshot's block was projected on them already; the most recently used _AXES_KEPT
# (a process searching more tables makes a forgotten table's axes again: any axes keep the search exact).
_AXES: OrderedDict[tuple, Axes] = OrderedDict()
_AXES_KEPT = 256
_AXES_LOCK = threading.Lock()


def _head(ds: lance.LanceDataset, piece: _Piece, axes: Axes, column: str) -> tuple[np.ndarray, float]:
    return cached(ds, ("flat head", column, axes.token), lambda: head_of(piece.vecs, axes))


def _pruning(reader: LsmReader, column: str, dim: int, metric: str,
             parts: list[tuple[lance.LanceDataset, _Piece, np.ndarray]], vecs: np.ndarray) -> Pruning | None:
    """The block's Pruning, its rows' heads reused: each generation's rows are projected once per set of axes,
    and the axes are made again from the block only when most of its live rows have no head under them."""
    if not prunable(len(vecs), dim):
        return None
    key = (reader.store.uri, column, metric, dim)
    with _AXES_LOCK:
        axes = _AXES.get(key)
        if axes is not None:
            _AXES.move_to_end(key)
    if axes is not None:
        fresh = sum(int(live.sum()) for ds, _, live in parts if peek(ds, ("flat head", column, axes.token)) is None)
        if fresh * 2 > len(vecs):
            axes = None
    if axes is None:
        axes = axes_of(vecs, metric)
        with _AXES_LOCK:
            _AXES[key] = axes
            while len(_AXES) > _AXES_KEPT:
                _AXES.popitem(last=False)
    heads = [(_head(ds, piece, axes, column), live) for ds, piece, live in parts if live.any()]
    first = np.concatenate([h[0] if live.all() else h[0][:, live] for h, live in heads], axis=1)
    return pruning_under(axes, first, max(h[1] for h, _ in heads))


def _live(rows: np.ndarray, live: np.ndarray) -> np.ndarray:
    """The live rows of a piece's array: the array itself when all are (concatenated once, not copied twice)."""
    return rows if live.all() else rows[live]


def flat_block(reader: LsmReader, positions: tuple[int, ...], column: str, dim: int, view: View, metric: str
               ) -> FlatBlock:
    """The FlatBlock of the small sources at `positions`, cached per snapshot; each source's vectors (and their
    projected heads) are read once per process for a generation, so a new snapshot reads only what is new."""
    key = ("flat block", positions, column, view, metric)
    cache = reader.search_cache
    if key not in cache:
        parts = []
        for position in positions:
            ds = source_at(reader, position).dataset
            piece = _piece(ds, column, dim, metric)
            parts.append((ds, piece, is_live(reader, position, pa.table({"_rowaddr": piece.addrs}), view)))
        if parts:
            counts = [int(live.sum()) for _, _, live in parts]
            pos = np.repeat(np.array(positions), counts)
            gens = np.repeat(np.array([source_at(reader, p).generation for p in positions]), counts)
            addrs, vecs, sq = (np.concatenate([_live(getattr(piece, f), live) for _, piece, live in parts])
                               for f in ("addrs", "vecs", "sq"))
        else:
            pos, gens, addrs = np.zeros(0, int), np.zeros(0, int), np.zeros(0, np.uint64)
            vecs, sq = np.zeros((0, dim), np.float32), np.zeros(0)
        cache[key] = _block(pos, gens, addrs, vecs, sq, metric, _pruning(reader, column, dim, metric, parts, vecs))
    return cache[key]


def passing(reader: LsmReader, block: FlatBlock, positions: tuple[int, ...], filter: Filter) -> np.ndarray:
    """The block rows passing `filter` (sorted indices), read once per snapshot for a filter string (the last
    _FILTERS_KEPT kept): each small source's row addresses passing it, matched to the block's rows."""
    cached = isinstance(filter, str)
    kept = reader.search_cache.setdefault(("flat filters", positions, id(block)), OrderedDict())
    if cached and filter in kept:
        kept.move_to_end(filter)
        return kept[filter]
    mask = np.zeros(len(block.addrs), bool)
    for position in positions:
        rows = np.flatnonzero(block.positions == position)
        if len(rows) == 0:
            continue
        t = source_at(reader, position).dataset.to_table(columns=[], filter=filter, with_row_address=True)
        mask[rows] = member(block.addrs[rows], np.sort(t.column("_rowaddr").to_numpy().astype(np.uint64)))
    found = np.flatnonzero(mask)
    if cached:
        kept[filter] = found
        while len(kept) > _FILTERS_KEPT:
            kept.popitem(last=False)
    return found


def flat_top(block: FlatBlock, q: np.ndarray, k: int, metric: str, rows: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """Entries of the block (among `rows`, default all) and exact distances of its k nearest rows. A float32
    matrix-vector product ranks the rows; every row within its rounding bound of the k-th is re-ranked with
    exact float64 distances, so the top k is the exact one. The ranking drops each metric's per-query constant
    terms (|q|^2, 1, the 1/|q| of cosine), which move every row alike: no pass is spent on them."""
    if block.pruning is not None and (rows is None or len(rows) >= MIN_ROWS):
        survivors = pruned_rows(block.pruning, block.vecs, block.sq, block.neg_inv, q, k, rows)
        rows = rows if survivors is None else survivors
    vecs = block.vecs if rows is None else block.vecs[rows]
    if len(vecs) == 0:
        return np.zeros(0, int), np.zeros(0)
    # einsum, not `@`: a matrix-vector product through multi-threaded BLAS took 11 ms instead of 0.25 on a
    # loaded 2-core machine (its threads spin against the other work).
    dots = np.einsum("ij,j->i", vecs, q)
    qn = float(np.linalg.norm(q.astype(np.float64)))
    # |float32 dot - exact dot| <= dim * eps32 * |v| |q| (a generous bound, doubled for the other operand).
    slack = 4 * q.shape[0] * float(np.finfo(np.float32).eps)
    if metric == "cosine":  # (1 - cosine - 1) |q| = -dot / |v|
        approx = dots * (block.neg_inv if rows is None else block.neg_inv[rows])
        bound = slack * qn
    elif metric == "l2":  # squared L2 - |q|^2
        approx = (block.sq if rows is None else block.sq[rows]) - 2.0 * dots
        bound = 2 * slack * block.max_norm * qn
    else:  # 1 - dot - 1
        approx = -dots
        bound = slack * block.max_norm * qn
    if len(approx) > k:
        threshold = float(np.partition(approx, k - 1)[k - 1]) + 2 * bound
        # Compared in the ranking's type (float32 for dot): widened so that rounding it there cannot drop a row.
        near = np.flatnonzero(approx <= threshold + 2 * _EPS32 * abs(threshold))
    else:
        near = np.arange(len(approx))
    dist = distances(vecs[near], q, metric)
    near, dist = near[np.isfinite(dist)], dist[np.isfinite(dist)]
    order = np.argsort(dist, kind="stable")[:k]
    picked = near[order]
    return (picked if rows is None else rows[picked]), dist[order]


def small_rows(reader: LsmReader, position: int, columns: tuple[str, ...], schema: pa.Schema
               ) -> tuple[np.ndarray, pa.Table]:
    """A small source's rows (the given columns, in the result's types) with their sorted row addresses,
    read once per snapshot (a generation's once per process): a result row of it is then a slice, not a take."""
    key = ("flat rows", position, columns)
    cache = reader.search_cache
    if key not in cache:
        ds = source_at(reader, position).dataset

        def read() -> tuple[np.ndarray, pa.Table]:
            t = ds.to_table(columns=list(columns), with_row_address=True)
            addrs = t.column("_rowaddr").to_numpy().astype(np.uint64)
            order = np.argsort(addrs, kind="stable")
            return addrs[order], t.select(list(columns)).take(pa.array(order)).cast(schema)

        cache[key] = cached(ds, ("flat rows", columns, schema), read)
    return cache[key]
