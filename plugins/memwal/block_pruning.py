"""An exact k-nearest search of the flat block that reads a quarter of it. Once per snapshot the block is centred
and projected on its first principal axes (its head); a query reads every row's head, with two more columns so
that one product gives each row a lower bound of its key (Cauchy-Schwarz for the dimensions not read), and only
the rows whose bound can still beat the k-th best exact key among a few seeds go on to the exact ranking
(memwal.flat_block.flat_top). The bounds carry float32's rounding: no row that can be in the top k is dropped.
"""

from __future__ import annotations

import itertools
import math
import threading
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import ThreadpoolController

__all__ = ["MIN_DIM", "MIN_ROWS", "Axes", "Pruning", "axes_of", "head_dims", "head_of", "prunable", "pruned_rows",
           "pruning_of", "pruning_under"]

# The smallest block worth projecting: below these one pass over the whole block costs about what the head
# pass does (bench/README.md, "search.py": fixed costs).
MIN_ROWS = 4096
MIN_DIM = 64
# Rows of the block sampled for the principal axes: any orthonormal axes keep the search exact; they only decide
# how much the head rules out.
_SAMPLE = 4096
# Rows converted to float64 at a time when the block is projected (a few MB: they stay in cache).
_CHUNK = 4096
# Rows whose exact keys give the threshold (their k-th smallest): the k best bounds alone left thousands of
# rows where 64 leave about k (bench/README.md).
_SEEDS = 64
# Past this share of the rows left after the head pass (a query about equally far from every row), the exact
# ranking of what is left costs more than one pass over the whole block: give up.
_GIVE_UP = 0.25
_EPS32 = float(np.finfo(np.float32).eps)
_BLAS: ThreadpoolController | None = None
_BLAS_LOCK = threading.Lock()


def _one_blas_thread() -> AbstractContextManager:
    """A context in which BLAS runs on one thread: OpenBLAS's threads spin against other work on a busy machine
    (the projection below took 708 ms instead of 121 on 2 loaded cores, bench/README.md)."""
    global _BLAS
    with _BLAS_LOCK:
        if _BLAS is None:
            _BLAS = ThreadpoolController()
    return _BLAS.limit(limits=1, user_api="blas")


def head_dims(dim: int) -> int:
    """Dimensions read for every row: a quarter of them, at least 32."""
    return max(32, dim // 4)


@dataclass(frozen=True)
class Pruning:
    """The block's rows w = (v - mean) @ axes (unit vectors v under cosine). `first` holds, one contiguous
    float32 column per term (a product over it reads each once): the head of w, |w beyond the head| (rounded
    up) and -|w|^2 / 2 (l2) or 0; `norm_max` is the largest |w| (or more: it only widens the bounds)."""

    metric: str
    mean: np.ndarray
    axes: np.ndarray
    first: np.ndarray
    norm_max: float


@dataclass(frozen=True)
class Axes:
    """Where a block's rows are projected: its mean and first principal axes (d x head_dims(d), orthonormal).
    Any such axes keep the search exact, so rows projected once (a generation's, memwal.flat_block) are not
    projected again for the next snapshot; `token` tells heads made under different axes apart."""

    metric: str
    mean: np.ndarray
    axes: np.ndarray
    token: int = field(default_factory=lambda: next(_TOKENS))


_TOKENS = itertools.count(1)


def prunable(n: int, d: int) -> bool:
    """Whether a block of n rows of d dimensions is large and wide enough for pruning to pay."""
    return n >= MIN_ROWS and d >= MIN_DIM


def _inverse_norms(vecs: np.ndarray, metric: str) -> np.ndarray | None:
    return 1.0 / np.sqrt(np.einsum("ij,ij->i", vecs, vecs, dtype=np.float64)) if metric == "cosine" else None


def axes_of(vecs: np.ndarray, metric: str) -> Axes:
    """The mean and principal axes of these rows (rows with a defined distance only; from a sample of them)."""
    n, d = vecs.shape
    inv = _inverse_norms(vecs, metric)
    mean = np.zeros(d)
    for a in range(0, n, _CHUNK):
        v = vecs[a:a + _CHUNK].astype(np.float64)
        mean += (v * inv[a:a + _CHUNK, None] if inv is not None else v).sum(axis=0)
    mean /= max(n, 1)
    picked = np.linspace(0, n - 1, min(n, _SAMPLE)).astype(int)
    sample = vecs[picked].astype(np.float64) * (inv[picked, None] if inv is not None else 1.0) - mean
    with _one_blas_thread():
        _, axes = np.linalg.eigh(sample.T @ sample)
    return Axes(metric, mean, np.ascontiguousarray(axes[:, ::-1][:, :head_dims(d)]))  # the largest variance first


def head_of(vecs: np.ndarray, axes: Axes) -> tuple[np.ndarray, float]:
    """These rows' part of Pruning.first under `axes` ((head_dims + 2) x n float32) and their largest |w|."""
    n = len(vecs)
    m = axes.axes.shape[1]
    inv = _inverse_norms(vecs, axes.metric)
    first = np.empty((m + 2, n), np.float32)
    sq = np.empty(n)
    with _one_blas_thread():
        for a in range(0, n, _CHUNK):  # a chunk at a time: no float64 copy of the whole block
            v = vecs[a:a + _CHUNK].astype(np.float64)
            v = (v * inv[a:a + _CHUNK, None] if inv is not None else v) - axes.mean
            head = v @ axes.axes
            sq[a:a + len(v)] = np.einsum("ij,ij->i", v, v)
            first[:m, a:a + len(v)] = head.T
            # |w beyond the head| = sqrt(|w|^2 - |head|^2), rounded up by what float64 may have lost (the axes
            # are orthonormal to ~1e-15).
            first[m, a:a + len(v)] = np.sqrt(np.maximum(sq[a:a + len(v)] - np.einsum("ij,ij->i", head, head), 0.0)
                                             ) + 1e-7 * np.sqrt(sq[a:a + len(v)])
    first[m + 1] = -0.5 * sq if axes.metric == "l2" else 0.0
    return first, float(np.sqrt(sq.max())) if n else 0.0


def pruning_under(axes: Axes, first: np.ndarray, norm_max: float) -> Pruning:
    """The Pruning of rows whose heads under `axes` (head_of, put together) are `first`."""
    return Pruning(axes.metric, axes.mean, axes.axes, first, norm_max)


def pruning_of(vecs: np.ndarray, metric: str) -> Pruning | None:
    """The projected head of a block's vectors (rows with a defined distance only), or None when the block is
    too small or too narrow for pruning to pay."""
    n, d = vecs.shape
    if not prunable(n, d):
        return None
    axes = axes_of(vecs, metric)
    return pruning_under(axes, *head_of(vecs, axes))


def _kth_key(p: Pruning, vecs: np.ndarray, q: np.ndarray, sq: np.ndarray, neg_inv: np.ndarray, rows: np.ndarray,
             k: int) -> float:
    """The k-th smallest exact key (flat_top's: |v|^2 - 2 v.q, -v.q / |v|, -v.q) among `rows` (at least k):
    at least the k-th smallest key of the whole block."""
    dots = vecs[rows].astype(np.float64) @ q.astype(np.float64)
    if p.metric == "l2":
        return float(np.partition(sq[rows] - 2.0 * dots, k - 1)[k - 1])
    keys = dots * neg_inv[rows] if p.metric == "cosine" else -dots
    return float(np.partition(keys, k - 1)[k - 1])


def pruned_rows(p: Pruning, vecs: np.ndarray, sq: np.ndarray, neg_inv: np.ndarray, q: np.ndarray, k: int,
                rows: np.ndarray | None = None) -> np.ndarray | None:
    """Block rows (among `rows`, default all) that may be among the k nearest to `q`: a superset of the exact
    top k, usually a small one; None when the head rules out too few rows to be worth it (_GIVE_UP). `vecs`,
    `sq` and `neg_inv` are the block's (memwal.flat_block.FlatBlock).

    With s = head(w).head(x) + |w beyond| |x beyond| - |w|^2 / 2 (l2) >= w.x - |w|^2 / 2 (Cauchy-Schwarz):
    l2, x = rotated q - mean: key = |v - q|^2 - |q|^2 = |x|^2 - 2 (w.x - |w|^2 / 2) - |q|^2 >= |x|^2 - |q|^2 - 2 s;
    dot and cosine, x = rotated q: key = -(w.x + mean.q) >= -mean.q - s."""
    l2 = p.metric == "l2"
    q64 = q.astype(np.float64)
    centred = q64 - p.mean if l2 else q64
    x = p.axes.T @ centred
    x_sq = float(centred @ centred)
    x_beyond = math.sqrt(max(x_sq - float(x @ x), 0.0)) + 1e-7 * math.sqrt(x_sq)
    shift = x_sq - float(q64 @ q64) if l2 else -float(p.mean @ q64)
    scale = 2.0 if l2 else 1.0  # key >= shift - scale * s
    # s is a float32 sum of head + 2 products of float32-rounded terms: off by at most 4 (head + 2) eps32 times
    # the sum of the terms' sizes (|w| |x|, |w| |x|, |w|^2 / 2); doubled, with float64's rounding of the keys.
    size = 2 * p.norm_max * math.sqrt(x_sq) + (0.5 * p.norm_max ** 2 if l2 else 0.0)
    tol = scale * 2 * 4 * (len(x) + 2) * _EPS32 * size + 1e-12 * (abs(shift) + float(q64 @ q64) + x_sq)
    aug = np.append(x, [x_beyond, 1.0]).astype(np.float32)
    s = np.einsum("ji,j->i", p.first if rows is None else p.first[:, rows], aug)
    n = len(s)
    if n <= k:
        return None
    m = n - min(n, max(k, _SEEDS))
    seeds = np.flatnonzero(s >= np.partition(s, m)[m])  # the best bounds (ties: a few more); no index sort
    tau = _kth_key(p, vecs, q, sq, neg_inv, seeds if rows is None else rows[seeds], k)
    threshold = (shift - tau - tol - 1e-12 * abs(tau)) / scale  # key bound <= tau  <=>  s >= threshold
    left = np.flatnonzero(s >= np.nextafter(np.float32(threshold), np.float32(-np.inf)))
    if len(left) > _GIVE_UP * n:
        return None
    return left if rows is None else np.asarray(rows)[left]
