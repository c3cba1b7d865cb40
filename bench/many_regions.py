"""Many regions in one merge (issue 44): 64 regions of 2 generations against 1 region, in process.

The tables of bench/maintenance.py (a 100,000-row base, each region 2 generations of 1,000 rows written by
Lance core's writer). Each run merges a fresh copy in a fresh Python process (`bench/maintenance.py
--child`: interpreter and imports timed apart from `merge_table`); the region counts alternate run by run
so that a burst of load hits both. Reported: the median run of each count, start-up included and
excluded, its Lance commits and where the merge's time went (plan / dedup / commit); the ratio
64 regions / 1 region, start-up included (target <= 1.3). `--spark` adds the same through spark-submit
(`bench/maintenance.py`'s run_spark). `--profile N` instead merges an N-region copy under cProfile in this
process and prints the top entries by cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
sys.path.insert(0, os.path.join(REPO, "plugins"))

from maintenance import build, run_local, run_spark, same_table  # noqa: E402
from merge import log  # noqa: E402


def _median(runs: list[dict], key: str) -> dict:
    ordered = sorted(runs, key=lambda r: r[key])
    return {**ordered[len(ordered) // 2], "all": [round(r[key], 3) for r in runs]}


def profile(src: str, work: str, top: int) -> None:
    from memwal.merge import merge_table

    dst = os.path.join(work, "profiled")
    shutil.copytree(src, dst)
    prof = cProfile.Profile()
    prof.enable()
    summary = merge_table(dst)
    prof.disable()
    print(f"{summary.table_commits} Lance commits, timings {summary.timings_s}")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(top)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--regions", default="1,64")
    p.add_argument("--base-rows", type=int, default=100_000)
    p.add_argument("--generations", type=int, default=2)
    p.add_argument("--gen-rows", type=int, default=1_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--spark", action="store_true", help="also through spark-submit (local[*])")
    p.add_argument("--profile", type=int, default=0, help="profile a merge of this many regions instead")
    p.add_argument("--top", type=int, default=45)
    p.add_argument("--dir", default=None)
    args = p.parse_args()
    counts = [int(x) for x in args.regions.split(",") if x]
    work = tempfile.mkdtemp(prefix="bench-many-regions-", dir=args.dir)
    try:
        srcs = {}
        for n in ([args.profile] if args.profile else counts):
            srcs[n] = os.path.join(work, f"src-{n}")
            log(f"building {args.base_rows} base rows + {n} region(s) x {args.generations} generations")
            build(srcs[n], n, args.base_rows, args.generations, args.gen_rows)
        if args.profile:
            return profile(srcs[args.profile], work, args.top)
        engines = {"in process": run_local} | ({"spark": lambda t: run_spark(t, "local[*]")} if args.spark else {})
        runs: dict = {(e, n): [] for e in engines for n in counts}
        for i in range(args.repeat):
            for e, fn in engines.items():
                for n in counts:
                    dst = os.path.join(work, f"run-{n}")
                    shutil.copytree(srcs[n], dst)
                    log(f"{e}, {n} region(s), run {i + 1} of {args.repeat}")
                    r = fn(dst)
                    if r["failed"]:
                        raise SystemExit(f"merge failed: {r['failed']}")
                    if i == 0 and e == "in process":
                        ref = os.path.join(work, f"ref-{n}")
                        shutil.copytree(dst, ref)
                    elif i == 0:
                        assert same_table(dst, os.path.join(work, f"ref-{n}")), "Spark result differs"
                    runs[(e, n)].append(r)
                    shutil.rmtree(dst)
        print(f"\nmerge of N regions x {args.generations} generations x {args.gen_rows} rows (Lance core writer) "
              f"into {args.base_rows} rows, median of {args.repeat}")
        for e in engines:
            med = {n: _median(runs[(e, n)], "wall_s") for n in counts}
            for n, r in med.items():
                t = ", ".join(f"{k} {v:.3f}" for k, v in r["timings"].items())
                print(f"  {e}, {n:3d} region(s): total {r['wall_s']:.2f} s = start-up {r['startup_s']:.2f} + merge "
                      f"{r['merge_s']:.3f} s in {r['table_commits']} Lance commits ({t}); totals {r['all']}")
            if 1 in med and 64 in med:
                ratio = med[64]["wall_s"] / med[1]["wall_s"]
                # start-up does not depend on the region count, but swings with the machine's load: the
                # median over every run of both counts, added to each count's median merge
                startup = sorted(r["startup_s"] for n in counts for r in runs[(e, n)])
                common = startup[len(startup) // 2]
                m1, m64 = (_median(runs[(e, n)], "merge_s")["merge_s"] for n in (1, 64))
                print(f"  {e}: 64 regions / 1 region, start-up included: {ratio:.2f} (target <= 1.3); with the "
                      f"median start-up of all runs ({common:.2f} s) and each count's median merge "
                      f"({m64:.3f} / {m1:.3f} s): {(common + m64) / (common + m1):.2f}; merge alone {m64 / m1:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
