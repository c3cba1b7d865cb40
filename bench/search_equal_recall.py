"""bench/search.py's equal-recall mode (issue 44): for each recall target, the cheapest settings (nprobes,
refine_factor) of ours and of the base-table ANN alone that reach it, and their p50 ratio.

Recall is swept per refine factor over growing nprobes (stopping once the highest target is reached: more
probes only cost more); per target and contestant, the smallest nprobes reaching it at each refine factor is a
candidate; every candidate of both contestants is then timed in one interleaved loop (each query runs every
candidate in turn, so the machine's load falls on all alike), and per target the cheapest timed setting (by p50)
whose recall reaches it is kept.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np

TARGETS = (0.90, 0.95, 0.99)
NPROBES = (5, 10, 15, 20, 25, 30, 35, 40, 50, 60, 70, 80, 100, 120, 160, 200, 240, 320, 480, 640, 1000)
REFINES = (1, 2, 3, 5, 7, 10, 15, 20)

Search = Callable[[np.ndarray, int, int], list]  # (query, nprobes, refine_factor) -> ids
Setting = tuple[int, int]  # (nprobes, refine_factor)


def recall(results: list, truth: list, k: int) -> float:
    return float(np.mean([len(set(r) & set(t)) / k for r, t in zip(results, truth, strict=True)]))


def sweep(search: Search, queries: np.ndarray, truth: list, k: int, partitions: int) -> dict[Setting, float]:
    """recall@k per setting: per refine factor, nprobes growing until the highest target is reached."""
    found: dict[Setting, float] = {}
    probes = sorted({min(n, partitions) for n in NPROBES})
    for refine in REFINES:
        for nprobes in probes:
            found[nprobes, refine] = recall([search(q, nprobes, refine) for q in queries], truth, k)
            if found[nprobes, refine] >= max(TARGETS):
                break
    return found


def candidates(recalls: dict[Setting, float], target: float) -> list[Setting]:
    """Per refine factor, the smallest nprobes whose recall reaches `target`."""
    out = []
    for refine in REFINES:
        reaching = sorted(n for (n, r), got in recalls.items() if r == refine and got >= target)
        if reaching:
            out.append((reaching[0], refine))
    return out


def timed(fns: Sequence[Callable[[np.ndarray], object]], queries: np.ndarray, repeat: int) -> list[float]:
    """p50 ms of each function, all timed in one loop (every query runs each function in turn, in an order
    shuffled per query: none always follows the same other one's cache footprint), after a warm-up."""
    for q in queries:
        for fn in fns:
            fn(q)
    times: list[list[float]] = [[] for _ in fns]
    order = np.random.default_rng(44)
    for _ in range(repeat):
        for q in queries:
            for i in order.permutation(len(fns)):
                t = time.perf_counter()
                fns[i](q)
                times[i].append(time.perf_counter() - t)
    return [statistics.median(t) * 1000 for t in times]


def equal_recall(contestants: dict[str, Search], queries: np.ndarray, truth: list, k: int, partitions: int,
                 repeat: int) -> dict[float, dict[str, tuple[Setting, float, float] | None]]:
    """Per target and contestant: the cheapest (setting, recall, p50 ms) reaching it, or None. Prints the table."""
    recalls = {name: sweep(fn, queries, truth, k, partitions) for name, fn in contestants.items()}
    wanted = sorted({(name, s) for name in contestants for t in TARGETS for s in candidates(recalls[name], t)})
    p50s = dict(zip(wanted, timed([_bound(contestants[name], s) for name, s in wanted], queries, repeat),
                    strict=True))
    out: dict[float, dict[str, tuple[Setting, float, float] | None]] = {}
    for target in TARGETS:
        out[target] = {}
        for name in contestants:
            options = [(ms, s) for (n, s), ms in p50s.items() if n == name and recalls[name][s] >= target]
            if options:
                ms, s = min(options)
                out[target][name] = (s, recalls[name][s], ms)
            else:
                out[target][name] = None
    _print(out, recalls, list(contestants), k)
    return out


def _bound(search: Search, setting: Setting) -> Callable[[np.ndarray], object]:
    nprobes, refine = setting
    return lambda q: search(q, nprobes, refine)


def _print(out: dict, recalls: dict, names: list[str], k: int) -> None:
    print(f"equal recall (recall@{k}; cheapest nprobes / refine_factor reaching each target, p50 timed interleaved):")
    for target, row in out.items():
        cells = []
        for name in names:
            got = row[name]
            if got is None:
                best = max(recalls[name].values())
                cells.append(f"{name}: not reached (best {best:.3f})")
            else:
                (nprobes, refine), rec, ms = got
                cells.append(f"{name}: nprobes {nprobes} refine {refine} recall {rec:.3f} p50 {ms:.2f} ms")
        ratio = ""
        if all(row[n] is not None for n in names[:2]):
            ratio = f"  ratio {row[names[0]][2] / row[names[1]][2]:.2f}  (target <= 1.3)"
        print(f"  {target:.2f}: " + "; ".join(cells) + ratio)
