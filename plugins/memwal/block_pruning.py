"""An exact k-nearest search of the flat block that reads a quarter of it. Once per snapshot the block is centred
and projected on its first principal axes (its head); a query reads every row's head, with two more columns so
that one product gives each row a lower bound of its key (Cauchy-Schwarz for the dimensions not read), and only
the rows whose bound can still beat the k-th best exact key among a few seeds go on to the exact ranking
(memwal.flat_block.flat_top). The bounds carry float32's rounding: no row that can be in the top k is dropped.
"""

from __future__ import annotations

import math
import threading
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np
from threadpoolctl import ThreadpoolController

__all__ = ["MIN_DIM", "MIN_ROWS", "Pruning", "head_dims", "pruned_rows", "pruning_of"]

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
    up) and -|w|^2 / 2 (l2) or 0; `norm_max` is the largest |w|."""

    metric: str
    mean: np.ndarray
    axes: np.ndarray
    first: np.ndarray
    norm_max: float


def pruning_of(vecs: np.ndarray, metric: str) -> Pruning | None:
    """The projected head of a block's vectors (rows with a defined distance only), or None when the block is
    too small or too narrow for pruning to pay."""
    n, d = vecs.shape
    if n < MIN_ROWS or d < MIN_DIM:
        return None
    inv = 1.0 / np.sqrt(np.einsum("ij,ij->i", vecs, vecs, dtype=np.float64)) if metric == "cosine" else None

    def rows(a: int, b: int) -> np.ndarray:  # float64 rows a..b (unit vectors under cosine), centred once known
        v = vecs[a:b].astype(np.float64)
        return v * inv[a:b, None] if inv is not None else v

    mean = np.zeros(d)
    for a in range(0, n, _CHUNK):
        mean += rows(a, a + _CHUNK).sum(axis=0)
    mean /= n
    picked = np.linspace(0, n - 1, min(n, _SAMPLE)).astype(int)
    sample = vecs[picked].astype(np.float64) * (inv[picked, None] if inv is not None else 1.0) - mean
    m = head_dims(d)
    first = np.empty((m + 2, n), np.float32)
    sq = np.empty(n)
    with _one_blas_thread():
        _, axes = np.linalg.eigh(sample.T @ sample)
        axes = np.ascontiguousarray(axes[:, ::-1][:, :m])  # the largest variance first
        for a in range(0, n, _CHUNK):  # a chunk at a time: no float64 copy of the whole block
            v = rows(a, a + _CHUNK) - mean
            head = v @ axes
            sq[a:a + len(v)] = np.einsum("ij,ij->i", v, v)
            first[:m, a:a + len(v)] = head.T
            # |w beyond the head| = sqrt(|w|^2 - |head|^2), rounded up by what float64 may have lost (the axes
            # are orthonormal to ~1e-15).
            first[m, a:a + len(v)] = np.sqrt(np.maximum(sq[a:a + len(v)] - np.einsum("ij,ij->i", head, head), 0.0)
                                             ) + 1e-7 * np.sqrt(sq[a:a + len(v)])
    first[m + 1] = -0.5 * sq if metric == "l2" else 0.0
    return Pruning(metric, mean, axes, first, float(np.sqrt(sq.max())))


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
    seeds = np.argpartition(s, n - min(n, max(k, _SEEDS)))[n - min(n, max(k, _SEEDS)):]
    tau = _kth_key(p, vecs, q, sq, neg_inv, seeds if rows is None else rows[seeds], k)
    threshold = (shift - tau - tol - 1e-12 * abs(tau)) / scale  # key bound <= tau  <=>  s >= threshold
    left = np.flatnonzero(s >= np.nextafter(np.float32(threshold), np.float32(-np.inf)))
    if len(left) > _GIVE_UP * n:
        return None
    return left if rows is None else np.asarray(rows)[left]
