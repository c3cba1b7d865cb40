"""What one lag check costs as a table keeps more versions: storage requests and seconds (issue 23 item 11).

A MemWAL table (2 regions x 3 generations, merged) is given extra table versions (metadata-only commits, so
fragments and `_mem_wal/` stay the same) up to each count of `--versions`. At each count, on the local
filesystem and on S3 (a moto_server on 127.0.0.1, requests counted by a proxy in front of it: Lance's
requests and ours), it times and counts:

- `lag check`: what the lag monitor reads every run, `memwal.lag.measure(table, health=True)`;
- `full health`: `memwal.health.table_health(table)`, what `memwal status` and the page read on demand
  (it lists the table and plans a GC dry run).

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
import urllib.request
import uuid

import pyarrow as pa

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "plugins"))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "scripts"))

from ports import free_port  # noqa: E402
from s3_requests import counting_proxy  # noqa: E402

from memwal.health import table_health  # noqa: E402
from memwal.lag import measure  # noqa: E402
from memwal.merge import merge_table  # noqa: E402
from memwal.table import MemWalTable  # noqa: E402
from memwal.writer import RegionWriter, WriterConfig  # noqa: E402

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


def start_moto() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1",
                             "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
            return proc, endpoint
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.1)


def s3_options(endpoint: str) -> dict[str, str]:
    return {"aws_endpoint": endpoint, "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
            "aws_region": "us-east-1", "allow_http": "true"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--versions", default="20,300", help="table versions to measure at (comma-separated)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", help="write the numbers as JSON here")
    args = p.parse_args()
    counts = [int(v) for v in args.versions.split(",")]
    results: list[dict] = []
    tmp = tempfile.mkdtemp(prefix="memwal-lagcheck-")
    moto, endpoint = start_moto()
    try:
        import boto3

        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket="bench")
        local_uri, s3_uri = os.path.join(tmp, "t.lance"), "s3://bench/t.lance"
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
    finally:
        moto.terminate()
        moto.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
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
