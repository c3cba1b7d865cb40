"""What a due-work sweep costs as the fleet grows (issue 43): `memwal.probe.probe_tables` over a root of N tiny
MemWAL tables, cold (no state: every table read) and then unchanged (the states of the cold sweep: two LISTs
a table), at each N of `--sizes`.

The tables are copies of one (2 regions: generations merged, one flushed after, so merge and snapshot are
due) made with hard links, so 1,000 of them take seconds. Locally the requests counted are the library's own
object-store calls (`memwal.storage.ObjectStore`: Lance's reads of a changed table are not seen; an
unchanged table makes none). With `--s3 N` the same is measured on S3 (a moto_server on 127.0.0.1, every
request, Lance's and ours, counted by a proxy in front of it, `tests/support/s3_requests.py`) for N tables
uploaded before the clock starts.

Printed per size: seconds per sweep (cold, unchanged), requests per table, and the growth of the unchanged
sweep's time per table from the smallest size to each.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "plugins"))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "scripts"))

from memwal.merge import merge_table  # noqa: E402
from memwal.probe import next_states, probe_tables  # noqa: E402
from memwal.storage import ObjectStore  # noqa: E402

from support.maintenance import build_table, write_generations  # noqa: E402

_CALLS = ("get_buffer", "head", "list", "list_dirs", "list_files")  # `get` and `exists` go through these


@contextmanager
def counted_calls() -> Iterator[Counter]:
    """Counts the library's object-store calls (each is one request, or one per 1,000 listed objects)."""
    counts: Counter = Counter()
    originals = {name: getattr(ObjectStore, name) for name in _CALLS}

    def wrap(name):
        def call(self, *args, **kwargs):
            counts[name] += 1
            return originals[name](self, *args, **kwargs)
        return call

    for name in _CALLS:
        setattr(ObjectStore, name, wrap(name))
    try:
        yield counts
    finally:
        for name, fn in originals.items():
            setattr(ObjectStore, name, fn)


class _Loc:
    def __init__(self, uri: str, storage_options: dict | None = None):
        self.kind, self.uri, self.storage_options = "local", uri, storage_options


def template(where: str) -> str:
    """One tiny MemWAL table: 2 regions, merged, then one more generation flushed (merge, snapshot due)."""
    loc = _Loc(os.path.join(where, "template.lance"))
    regions = build_table(loc, regions=2, generations=2)
    merge_table(loc.uri)
    write_generations(loc, regions[0], [([9001], "late", [])])
    return loc.uri


def sweep(root: str, states: dict | None, storage_options: dict | None = None) -> tuple[float, list]:
    from memwal.probe import ProbeEntry

    started = time.perf_counter()
    results = probe_tables([ProbeEntry(root, storage_options, kind="root")], states)
    return time.perf_counter() - started, results


def local_sizes(sizes: list[int], tmp: str, source: str) -> list[dict]:
    out = []
    for n in sizes:
        root = os.path.join(tmp, f"root{n}")
        for i in range(n):
            shutil.copytree(source, os.path.join(root, f"t{i:05d}.lance"), copy_function=os.link)
        row: dict = {"where": "local", "tables": n}
        states = None
        for phase in ("cold", "unchanged"):
            with counted_calls() as calls:
                seconds, results = sweep(root, states)
            assert len(results) == n and all(r.status == "ok" for r in results), results[:1]
            assert all(r.jobs == ["merge", "snapshot"] for r in results)
            row[f"{phase}_s"] = round(seconds, 3)
            row[f"{phase}_requests_per_table"] = round((sum(calls.values()) - 1) / n, 2)  # less the root's LIST
            states = next_states(results)
        out.append(row)
        shutil.rmtree(root)
        print(json.dumps(row), flush=True)
    return out


def s3_size(n: int, source: str) -> dict:
    from conftest import new_bucket, s3_options
    from ports import free_port

    from support import atomic_moto
    from support.s3_requests import counting_proxy

    proc, endpoint = atomic_moto.start(free_port())
    try:
        options = s3_options(endpoint)
        bucket = new_bucket(endpoint)
        files = [os.path.relpath(os.path.join(d, f), source) for d, _, fs in os.walk(source) for f in fs]
        from concurrent.futures import ThreadPoolExecutor

        def upload(i: int) -> None:
            store = ObjectStore(f"s3://{bucket}/t{i:05d}.lance", options)
            for rel in files:
                with open(os.path.join(source, rel), "rb") as f:
                    store.put(rel, f.read())

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(upload, range(n)))
        row: dict = {"where": "s3 (moto)", "tables": n}
        states = None
        with counting_proxy(endpoint) as proxy:
            via = {**options, "aws_endpoint": proxy.endpoint}
            for phase in ("cold", "unchanged"):
                proxy.reset()
                seconds, results = sweep(f"s3://{bucket}", states, via)
                assert len(results) == n and all(r.status == "ok" for r in results), results[:1]
                row[f"{phase}_s"] = round(seconds, 3)
                row[f"{phase}_requests_per_table"] = round((sum(proxy.counts.values()) - 1) / n, 2)
                row[f"{phase}_kinds"] = dict(proxy.counts)
                states = next_states(results)
        print(json.dumps(row), flush=True)
        return row
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="50,200,1000", help="table counts, comma-separated")
    parser.add_argument("--s3", type=int, default=0, help="also this many tables on S3 (moto)")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        source = template(tmp)
        rows = local_sizes(sizes, tmp, source)
        if args.s3:
            rows.append(s3_size(args.s3, source))
    base = rows[0]["unchanged_s"] / rows[0]["tables"]
    for row in rows:
        if row["where"] == "local":
            row["unchanged_s_per_table_growth"] = round(row["unchanged_s"] / row["tables"] / base, 2)
    print("\n| where | tables | cold sweep s | unchanged sweep s | requests/table cold | requests/table unchanged |"
          " unchanged s/table vs smallest |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['where']} | {r['tables']} | {r['cold_s']} | {r['unchanged_s']} | {r['cold_requests_per_table']} | "
              f"{r['unchanged_requests_per_table']} | {r.get('unchanged_s_per_table_growth', '-')} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
