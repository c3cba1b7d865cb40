"""memwal.flat_block: the small sources' block searched by one float32 product and an exact float64 re-rank
equals a brute-force float64 search, for every metric, with rows whose distance is undefined and near-ties
float32 cannot tell apart, over all rows or a subset (a filter's)."""

from __future__ import annotations

import numpy as np
import pytest

from memwal.flat_block import block_of, distances, flat_top

DIM = 32


def _rows() -> np.ndarray:
    """Vectors on a large common offset (float32 ranks near-ties wrongly there), exact duplicates, a zero vector,
    and rows holding NaN and inf."""
    rng = np.random.default_rng(44)
    v = (1000.0 + rng.standard_normal((400, DIM)) * 1e-3).astype(np.float32)
    v[10] = v[11]  # an exact tie
    v[20] = 0.0
    v[30, 3] = np.nan
    v[31, 5] = np.inf
    return v


def _brute(v: np.ndarray, q: np.ndarray, k: int, metric: str, rows: np.ndarray) -> list[tuple[float, int]]:
    d = distances(v[rows], q, metric)
    ok = np.isfinite(d)
    order = np.lexsort((rows[ok], d[ok]))[:k]
    return [(float(d[ok][i]), int(rows[ok][i])) for i in order]


@pytest.mark.parametrize("metric", ["l2", "cosine", "dot"])
@pytest.mark.parametrize("subset", [False, True])
def test_flat_top_is_the_exact_top_k(metric, subset):
    v = _rows()
    n = len(v)
    block = block_of(np.zeros(n, int), np.ones(n, int), np.arange(n, dtype=np.uint64), v, metric)
    entries = block.addrs.astype(int)  # the input row of each block entry (rows without a distance dropped)
    assert 20 not in entries if metric == "cosine" else 20 in entries
    assert 30 not in entries and 31 not in entries
    for seed in range(5):
        q = v[100 + seed] + np.random.default_rng(seed).standard_normal(DIM).astype(np.float32) * 1e-4
        rows = np.arange(0, len(entries), 3) if subset else None
        for k in (1, 7, 50):
            top, dist = flat_top(block, q, k, metric, rows)
            got = [(float(d), int(entries[i])) for i, d in zip(top, dist, strict=True)]
            want = _brute(v, q, k, metric, entries if rows is None else entries[rows])
            assert [d for d, _ in got] == [d for d, _ in want], f"{metric} k={k}: distances differ"
            assert {i for _, i in got} == {i for _, i in want} or got[-1][0] == want[-1][0], f"{metric} k={k}"
