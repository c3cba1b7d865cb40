"""Routing benchmark: memwal.region_spec.route of int64 rows into bucket regions, against Lance core's
evaluate_sharding_spec of the same rows (which computes the bucket values only, no grouping).

Prints the median seconds of each and `ratio ours/lance` (below 1 means ours is faster), plus ours per
million rows. Moved here from tests/library/test_region_spec.py, which had a wall-clock bound (issue 18).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import pyarrow as pa

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "plugins"))

from lance.mem_wal import evaluate_sharding_spec  # noqa: E402
from lance.schema import LanceSchema  # noqa: E402

from memwal.region_spec import RegionField, RegionSpec  # noqa: E402
from memwal.transforms import route  # noqa: E402


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--buckets", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    ids = np.random.default_rng(1).integers(-(2**63), 2**63 - 1, args.rows, dtype=np.int64)
    table = pa.table({"id": ids})
    spec = RegionSpec(1, (RegionField("b", (0,), "bucket", None, "int32", {"num_buckets": str(args.buckets)}),))
    batch = table.combine_chunks().to_batches()[0]
    schema = LanceSchema.from_pyarrow(table.schema)

    def ours() -> None:
        groups = route(spec, table, {0: "id"})
        assert sum(g.num_rows for g in groups.values()) == args.rows

    def lance() -> None:
        evaluate_sharding_spec(batch, spec.to_lance_dict(), schema)

    ours(), lance()  # warm-up
    t_ours, t_lance = [], []
    for _ in range(args.repeat):
        t_ours.append(_timed(ours))
        t_lance.append(_timed(lance))
    mo, ml = statistics.median(t_ours), statistics.median(t_lance)
    print(f"route {args.rows:,} int64 rows into {args.buckets} buckets, median of {args.repeat}")
    print(f"  ours (route, grouped):           {mo:.3f} s  ({mo / args.rows * 1e6:.3f} s per million rows)")
    print(f"  lance (evaluate_sharding_spec):  {ml:.3f} s")
    print(f"ratio ours/lance: {mo / ml:.2f}")


if __name__ == "__main__":
    main()
