"""What one lag check costs as a table keeps more versions or more files: storage requests and seconds
(issue 23 item 11, issue 24 "Index health").

A MemWAL table (2 regions x 3 generations, merged) is given extra table versions (metadata-only commits, so
fragments and `_mem_wal/` stay the same) up to each count of `--versions`. At each count, on the local
filesystem and on S3 (a moto_server on 127.0.0.1, requests counted by a proxy in front of it: Lance's
requests and ours), it times and counts:

- `lag check`: what the lag monitor reads every run, `memwal.lag.measure(table, health=True)`;
- `full health`: `memwal.health.table_health(table)`, what `memwal status` and the page read on demand
  (it lists the table and plans a GC dry run).

With `--files N[,N...]` (issue 24) the table (with a BTREE index, so the per-index health every lag check
adds has an index to read) is instead padded, between measurements, to N objects under its root, as earlier
versions and failed flushes leave them: old data files under `data/`, old transactions under
`_transactions/`, and generation directories of failed flushes under `_mem_wal/<region>/` (100 files
each). The padding is written before the clock starts (plain file writes locally, a thread pool of PUTs on
S3). `--plugins DIR` (or $MEMWAL_BENCH_PLUGINS) measures another copy of the library, e.g. an older commit's
`plugins/` exported by `git archive`, with the same script: `measure(table, health=True)` is the lag
monitor's call in both (the older `measure` had no `storage` argument nor per-index health).

Seconds are the median of `--repeat` runs on one handle (the monitor keeps none: each check opens the
table, so the open is timed too). Numbers from a shared machine are noisy; compare counts, and seconds
from the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _plugins_dir() -> str:
    """The library to measure: --plugins DIR, else $MEMWAL_BENCH_PLUGINS, else this repo's plugins/."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--plugins", default=os.environ.get("MEMWAL_BENCH_PLUGINS") or os.path.join(REPO, "plugins"))
    return os.path.abspath(pre.parse_known_args()[0].plugins)


PLUGINS = _plugins_dir()
sys.path.insert(0, PLUGINS)
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "scripts"))

from ports import free_port  # noqa: E402

from memwal.health import table_health  # noqa: E402
from memwal.lag import measure  # noqa: E402
from memwal.merge import merge_table  # noqa: E402
from memwal.table import MemWalTable  # noqa: E402
from memwal.writer import RegionWriter, WriterConfig  # noqa: E402

from support import atomic_moto  # noqa: E402
from support.s3_requests import counting_proxy  # noqa: E402

ONE_GEN_PER_FLUSH = WriterConfig(max_memtable_rows=10**9, max_flush_interval_s=None)


def build(uri: str, options: dict | None) -> None:
    import lance

    base = pa.table({"id": pa.array(range(10), pa.int64()), "name": [f"base{i}" for i in range(10)],
                     "score": pa.array([float(i) for i in range(10)])})
    schema = base.schema.set(0, pa.field("id", pa.int64(), nullable=False,
                                         metadata={b"lance-schema:unenforced-primary-key": b"true"}))
    ds = lance.write_dataset(base.cast(schema), uri, storage_options=options)
    ds.initialize_mem_wal(unsharded=True)
    for r in range(2):
        with RegionWriter(uri, str(uuid.uuid4()), storage_options=options, config=ONE_GEN_PER_FLUSH) as w:
            for g in range(3):
                ids = [1000 * (r + 1) + g, 1000 * (r + 1) + 100 + g]
                w.put(pa.table({"id": pa.array(ids, pa.int64()), "name": [f"r{r}g{g}"] * 2,
                                "score": pa.array([1.0, 2.0])}).cast(schema))
                w.flush()
    merge_table(MemWalTable(uri, options))


def add_versions(uri: str, options: dict | None, upto: int) -> int:
    import lance

    ds = lance.dataset(uri, storage_options=options)
    while ds.version < upto:
        ds.update_config({"bench.tick": str(ds.version)})
    return len(ds.versions())


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def stop_moto(proc: subprocess.Popen) -> None:
    """Stop the moto_server this bench started (killed if it does not stop in 10 s: with 100,000 objects it
    can be slow to), without hiding an exception being raised."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def s3_options(endpoint: str) -> dict[str, str]:
    return {"aws_endpoint": endpoint, "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
            "aws_region": "us-east-1", "allow_http": "true"}


FILES_IN_GEN_DIR = 100  # objects per padded generation directory
PAD_BYTES = b"x" * 64  # the padding's size is not read by the lag check; small keeps creation fast


def pad_names(start: int, stop: int, regions: list[str]) -> list[str]:
    """Object names (relative to the table root) of padding objects start..stop-1: 80% old data files,
    10% old transactions, 10% files of failed flushes' generation directories (generations 1-3, below the
    regions' current one), FILES_IN_GEN_DIR per directory. Deterministic in the index."""
    out = []
    for i in range(start, stop):
        slot = i % 10
        if slot < 8:
            out.append(f"data/{i:024b}{uuid.UUID(int=i).hex[:26]}.lance")
        elif slot == 8:
            out.append(f"_transactions/{i % 3}-{uuid.UUID(int=i)}.txn")
        else:
            k = i // 10
            gen_dir = k // FILES_IN_GEN_DIR
            region = regions[gen_dir % len(regions)]
            out.append(f"_mem_wal/{region}/{gen_dir:08x}_gen_{gen_dir % 3 + 1}/data/{k:032d}.lance")
    return out


def regions_of(uri: str, options: dict | None) -> list[str]:
    """The table's region ids (the `_mem_wal/` directories other than `_locks`)."""
    from memwal.table import MemWalTable

    store = MemWalTable(uri, options).store
    return sorted(d for d in store.list_dirs("_mem_wal") if not d.startswith("_"))


def count_objects(uri: str, options: dict | None) -> int:
    from memwal.table import MemWalTable

    return len(MemWalTable(uri, options).store.list(""))


def pad_local(root: str, names: list[str]) -> None:
    made: set[str] = set()
    for name in names:
        d = os.path.dirname(name)
        if d not in made:
            os.makedirs(os.path.join(root, d), exist_ok=True)
            made.add(d)
        with open(os.path.join(root, name), "wb") as f:
            f.write(PAD_BYTES)


def pad_s3(endpoint: str, bucket: str, prefix: str, names: list[str], threads: int = 32) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import obstore
    from obstore.store import S3Store

    store = S3Store(bucket, endpoint=endpoint, access_key_id="testing", secret_access_key="testing",
                    region="us-east-1", client_options={"allow_http": True})
    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(lambda n: obstore.put(store, f"{prefix}/{n}", PAD_BYTES), names, chunksize=256):
            pass


@contextmanager
def local_and_s3(prefix: str) -> Iterator[tuple[str, str, str]]:
    """A moto server with bucket `bench`: (its endpoint, a local table path, the S3 table URI); both gone
    afterwards."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    moto, endpoint = atomic_moto.start(free_port())  # the tests' moto_server (tests/support)
    try:
        import boto3

        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket="bench")
        yield endpoint, os.path.join(tmp, "t.lance"), "s3://bench/t.lance"
    finally:
        stop_moto(moto)
        shutil.rmtree(tmp, ignore_errors=True)


def add_index(uri: str, options: dict | None) -> None:
    import lance

    lance.dataset(uri, storage_options=options).create_scalar_index("name", "BTREE", name="name_idx")


def run_files(args: argparse.Namespace, counts: list[int]) -> list[dict]:
    """--files: the table padded to each object count in turn; the lag check (and once, the full reading)
    timed and counted at each."""
    results: list[dict] = []
    with local_and_s3("memwal-lagfiles-") as (endpoint, local_uri, s3_uri):
        for uri, opts in ((local_uri, None), (s3_uri, s3_options(endpoint))):
            build(uri, opts)
            add_index(uri, opts)
        regions = regions_of(local_uri, None)
        s3_regions = regions_of(s3_uri, s3_options(endpoint))
        base = {"local": count_objects(local_uri, None), "s3": count_objects(s3_uri, s3_options(endpoint))}
        padded = {"local": 0, "s3": 0}
        with counting_proxy(endpoint) as proxy:
            via_proxy = s3_options(proxy.endpoint)
            for n in counts:
                on_s3 = args.s3_max is None or n <= args.s3_max
                t0 = time.perf_counter()
                want = max(0, n - base["local"])
                pad_local(local_uri, pad_names(padded["local"], want, regions))
                padded["local"] = max(padded["local"], want)
                row: dict = {"files_local": count_objects(local_uri, None), "plugins": PLUGINS}
                if on_s3:
                    want = max(0, n - base["s3"])
                    pad_s3(endpoint, "bench", "t.lance", pad_names(padded["s3"], want, s3_regions))
                    padded["s3"] = max(padded["s3"], want)
                    row["files_s3"] = count_objects(s3_uri, s3_options(endpoint))
                row["pad_s"] = round(time.perf_counter() - t0, 1)
                row["load"] = os.getloadavg()[0]
                checks = [("lag_check", lambda t: measure(t, health=True), args.repeat)]
                if not args.no_full:
                    checks.append(("full_health", lambda t: table_health(t), 1))
                for name, fn, repeat in checks:
                    row[f"{name}_local_s"] = timed(lambda fn=fn: fn(MemWalTable(local_uri)), repeat)
                    out = fn(MemWalTable(local_uri))
                    if name == "lag_check":
                        row["lag_check_indexes"] = [i["name"] for i in out["indexes"]] if "indexes" in out else None
                    if not on_s3:
                        continue
                    times = []
                    for _ in range(repeat):
                        proxy.reset()
                        t1 = time.perf_counter()
                        fn(MemWalTable(s3_uri, via_proxy))
                        times.append(time.perf_counter() - t1)
                    row[f"{name}_s3_s"] = statistics.median(times)
                    row[f"{name}_s3_requests"] = dict(sorted(proxy.counts.items()))
                results.append(row)
                print(json.dumps(row), flush=True)
    print()
    print(f"{'files':>7}  {'check':>11}  {'local s':>8}  {'s3 s':>7}  {'GET':>5}  {'LIST':>5}  {'HEAD':>5}  indexes")
    for row in results:
        for name in ("lag_check", "full_health"):
            if f"{name}_local_s" not in row:
                continue
            req = row.get(f"{name}_s3_requests", {})
            s3_s = f"{row[f'{name}_s3_s']:7.3f}" if f"{name}_s3_s" in row else f"{'-':>7}"
            print(f"{row['files_local']:7d}  {name:>11}  {row[f'{name}_local_s']:8.3f}  {s3_s}  "
                  f"{req.get('GET', 0):5d}  {req.get('LIST', 0):5d}  {req.get('HEAD', 0):5d}  "
                  f"{row.get('lag_check_indexes') if name == 'lag_check' else ''}")
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--versions", default="20,300", help="table versions to measure at (comma-separated)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--files", help="instead of --versions: objects under the table root to measure at "
                                   "(comma-separated; the table is padded up to each)")
    p.add_argument("--s3-max", type=int, help="with --files: measure larger counts locally only (padding moto "
                                              "takes a few minutes per 100,000 PUTs)")
    p.add_argument("--no-full", action="store_true", help="with --files: leave out the full reading")
    p.add_argument("--plugins", help="the library to measure (default: this repo's plugins/; also "
                                     "$MEMWAL_BENCH_PLUGINS)")
    p.add_argument("--out", help="write the numbers as JSON here")
    args = p.parse_args()
    print(f"library: {PLUGINS}", flush=True)
    if args.files:
        results = run_files(args, [int(v) for v in args.files.split(",")])
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
        return
    counts = [int(v) for v in args.versions.split(",")]
    results: list[dict] = []
    with local_and_s3("memwal-lagcheck-") as (endpoint, local_uri, s3_uri):
        build(local_uri, None)
        build(s3_uri, s3_options(endpoint))
        with counting_proxy(endpoint) as proxy:
            via_proxy = s3_options(proxy.endpoint)
            for n in counts:
                row: dict = {"versions": add_versions(local_uri, None, n)}
                add_versions(s3_uri, s3_options(endpoint), n)
                for name, fn in (("lag_check", lambda t: measure(t, health=True)),
                                 ("full_health", lambda t: table_health(t))):
                    row[f"{name}_local_s"] = timed(lambda fn=fn: fn(MemWalTable(local_uri)), args.repeat)
                    row[f"{name}_s3_s"] = timed(lambda fn=fn: fn(MemWalTable(s3_uri, via_proxy)), args.repeat)
                    proxy.reset()
                    fn(MemWalTable(s3_uri, via_proxy))
                    row[f"{name}_s3_requests"] = dict(sorted(proxy.counts.items()))
                    row[f"{name}_manifest_gets"] = sum(1 for kind, path in proxy.paths
                                                       if kind == "GET" and path.endswith(".manifest")
                                                       and "/_versions/" in path)
                results.append(row)
                print(json.dumps(row), flush=True)
    print()
    print(f"{'versions':>8}  {'check':>11}  {'local s':>8}  {'s3 s':>7}  {'s3 GET':>6}  {'of manifests':>12}  "
          f"{'LIST':>5}  {'HEAD':>5}")
    for row in results:
        for name in ("lag_check", "full_health"):
            req = row[f"{name}_s3_requests"]
            print(f"{row['versions']:8d}  {name:>11}  {row[f'{name}_local_s']:8.3f}  {row[f'{name}_s3_s']:7.3f}  "
                  f"{req.get('GET', 0):6d}  {row[f'{name}_manifest_gets']:12d}  {req.get('LIST', 0):5d}  "
                  f"{req.get('HEAD', 0):5d}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
