"""memwal.flat_block: the small sources' block searched by one float32 product and an exact float64 re-rank
equals a brute-force float64 search, for every metric, with rows whose distance is undefined and near-ties
float32 cannot tell apart, over all rows or a subset (a filter's); so does a large block searched through its
projected head (memwal.block_pruning), which ranks exactly only the rows that can still win."""

from __future__ import annotations

import numpy as np
import pytest

from memwal.block_pruning import MIN_DIM, MIN_ROWS, pruned_rows
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


# The pruned search (memwal.block_pruning): blocks of at least MIN_ROWS rows and MIN_DIM dimensions.

def _clustered(n: int, dim: int, offset: float = 0.0) -> np.ndarray:
    """Rows in 64 tight clusters far apart (pruning must rule out all but about one cluster), on an offset,
    with exact duplicates and a near-tie float32 cannot tell apart."""
    rng = np.random.default_rng(7)
    centers = rng.standard_normal((64, dim)) * 10
    v = (offset + centers[np.arange(n) % 64] + rng.standard_normal((n, dim)) * 0.5).astype(np.float32)
    v[1] = v[0]
    v[3] = np.nextafter(v[2], np.float32(np.inf))
    return v


@pytest.mark.parametrize("metric", ["l2", "cosine", "dot"])
@pytest.mark.parametrize("dim", [64, 100, 128])
@pytest.mark.parametrize("offset", [0.0, 1000.0])
def test_the_pruned_search_is_the_exact_top_k(metric, dim, offset):
    n = MIN_ROWS + 904
    v = _clustered(n, dim, offset)
    block = block_of(np.zeros(n, int), np.ones(n, int), np.arange(n, dtype=np.uint64), v, metric)
    plain = block_of(np.zeros(n, int), np.ones(n, int), np.arange(n, dtype=np.uint64), v, metric, prune=False)
    assert block.pruning is not None and plain.pruning is None
    rng = np.random.default_rng(3)
    queries = [v[0], v[2], v[500] + 0.01, rng.standard_normal(dim).astype(np.float32) * 30,
               (v[10] + v[11]) / 2]  # on a row, on a near-tie, near a row, far from all, between two clusters
    subsets = [None, np.arange(0, n, 2), np.arange(0, n // 2)]
    for q in queries:
        for rows in subsets:
            for k in (1, 10, 100):
                got = flat_top(block, q, k, metric, rows)
                want = _brute(v, q, k, metric, np.arange(n) if rows is None else rows)
                # float64 distances summed in another order differ in the last bits: compare to 1e-12
                assert np.allclose(got[1], [d for d, _ in want], rtol=1e-12, atol=1e-12), f"{metric} {dim} {k}"
                boundary = {i for d, i in want if np.isclose(d, want[-1][0], rtol=1e-12, atol=1e-12)}
                assert {i for _, i in want} - boundary <= set(got[0].tolist()), f"{metric} dim={dim} k={k}"


@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_the_pruned_search_ranks_only_rows_that_can_win(metric):
    """A query at a row of one cluster: the head pass and its bounds leave at most that cluster's rows (n / 64)."""
    n, dim = 8192, 128
    v = _clustered(n, dim)
    block = block_of(np.zeros(n, int), np.ones(n, int), np.arange(n, dtype=np.uint64), v, metric)
    for row in (5, 77, 4000):
        left = pruned_rows(block.pruning, block.vecs, block.sq, block.neg_inv, v[row], 10)
        assert left is not None and row in left.tolist()
        assert len(left) <= n // 64, f"{metric}: {len(left)} rows left of {n}"
        assert set((left % 64).tolist()) == {row % 64}  # one cluster's rows only


def test_a_query_far_from_every_row_falls_back_to_one_pass():
    """Rows on a sphere and the query at its centre: every row is equally far, bounds rule out none, so the
    search gives up after the head pass and the block is searched in one pass, exactly."""
    n, dim = MIN_ROWS, 128
    v = np.random.default_rng(5).standard_normal((n, dim))
    v = (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)
    block = block_of(np.zeros(n, int), np.ones(n, int), np.arange(n, dtype=np.uint64), v, "l2")
    q = np.zeros(dim, np.float32)
    assert pruned_rows(block.pruning, block.vecs, block.sq, block.neg_inv, q, 10) is None
    _, dist = flat_top(block, q, 10, "l2")
    assert np.allclose(dist, [d for d, _ in _brute(v, q, 10, "l2", np.arange(n))], rtol=1e-12, atol=1e-12)


def test_small_or_narrow_blocks_are_not_rotated():
    rng = np.random.default_rng(1)
    for n, dim in ((MIN_ROWS - 1, 128), (MIN_ROWS, MIN_DIM - 1)):
        v = rng.standard_normal((n, dim)).astype(np.float32)
        assert block_of(np.zeros(n, int), np.ones(n, int), np.arange(n, dtype=np.uint64), v, "l2").pruning is None
