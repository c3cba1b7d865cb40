"""The two planning rules every planner shares (the merge, its Spark dedup and the Airflow DAGs).

- `leading_batch`: how many consecutive generations one batch takes: at least one, within a generation
  count and a byte budget (a merge commit, a backfill chunk, a bounded merge task);
- `largest_first`: items dealt into a number of groups of similar weight, largest first, each into the
  lightest group so far (region batches to Spark tasks, regions to Spark applications).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["largest_first", "leading_batch"]


def leading_batch(sizes: Sequence[int], max_count: int | None, max_bytes: int | None) -> int:
    """How many of the leading items (consecutive generations, `sizes` in bytes) fit one batch: always one
    at least (when there is one), then more while the batch stays within `max_count` items and `max_bytes`
    (None or 0: no limit)."""
    total = taken = 0
    for size in sizes:
        if taken and ((max_count and taken >= max_count) or (max_bytes and total + size > max_bytes)):
            break
        taken += 1
        total += size
    return taken


def largest_first(weights: Sequence[int], groups: int) -> list[list[int]]:
    """Indexes of `weights` dealt into at most `groups` non-empty groups: largest first (equal weights in
    the given order), each into the group with the least weight so far (then the fewest items)."""
    n = max(1, min(groups, len(weights)))
    bins: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for i in sorted(range(len(weights)), key=lambda i: -weights[i]):
        g = min(range(n), key=lambda k: (load[k], len(bins[k])))
        bins[g].append(i)
        load[g] += weights[i]
    return [b for b in bins if b]
