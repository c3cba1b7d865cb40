#!/usr/bin/env python
"""Soak MemWAL through a faulty S3 (issue 42): writers, merges and searches for --cycles cycles, every request
(ours and Lance's) through the fault proxy of tests/support/fault_proxy.py at seeded rates, and after every
cycle the LSM view must equal a dict model, with no generation lost or merged twice.

    .venv/bin/python scripts/fault_soak.py --cycles 20 --seed 7
    .venv/bin/python scripts/fault_soak.py --cycles 5 --rates 503=0.05,500=0.02,reset=0.01,lost=0.01,stall=0.01

Starts its own moto server on 127.0.0.1 (the tests' atomic one). Each cycle, per region: a writer claims the
region, puts and deletes a few keys, flushes one generation; then one merge of every region (with
--maintenance also a snapshot refresh and a GC run); then a scan and point reads. A step that fails (the
store kept failing after the client's retries, or a Lance commit gave up) is counted and rerun: puts and
deletes are idempotent upserts, so the model does not depend on whether a failed step landed. Prints faults
injected per kind, steps failed and rerun, rows lost. Exit 1 on a divergence. tests/scripts/test_fault_soak.py
runs it small; figures in bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO / "plugins", REPO / "tests", REPO / "scripts"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import pyarrow as pa  # noqa: E402

from memwal.gc import GcConfig, gc_table  # noqa: E402
from memwal.mem_wal_index import load_index  # noqa: E402
from memwal.merge import merge_table  # noqa: E402
from memwal.reader import LsmReader  # noqa: E402
from memwal.region_manifest import load_latest_manifest  # noqa: E402
from memwal.snapshot import refresh_snapshot  # noqa: E402
from memwal.storage import ObjectStore  # noqa: E402
from memwal.table import MemWalTable  # noqa: E402
from memwal.writer import RegionWriter, WriterConfig  # noqa: E402

from support.fault_proxy import KINDS, FaultProxy  # noqa: E402
from support.tables import rows  # noqa: E402

DEFAULT_RATES = {"503": 0.05, "500": 0.02, "reset": 0.01, "lost": 0.01, "stall": 0.01}
_NEVER = WriterConfig(max_memtable_rows=10**9, max_flush_interval_s=None)
_RERUNS = 8
_T = TypeVar("_T")
log = logging.getLogger("fault_soak")


@dataclass
class SoakReport:
    cycles: int = 0
    faults: Counter = field(default_factory=Counter)
    requests: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)  # step kind -> failures that were rerun
    failures: list[str] = field(default_factory=list)  # one line each
    rows_lost: int = 0
    divergences: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"cycles": self.cycles, "faults_injected": dict(self.faults), "requests": dict(self.requests),
                "steps_failed_and_rerun": dict(self.failed), "rows_lost": self.rows_lost,
                "divergences": self.divergences, "seconds": round(self.seconds, 1)}


def _rerun(report: SoakReport, step: str, call: Callable[[], _T]) -> _T:
    """Run one step; a failure is counted and the step rerun (at most _RERUNS times)."""
    for attempt in range(1, _RERUNS + 1):
        try:
            return call()
        except Exception as exc:  # every failure of a step is counted, then rerun
            report.failed[step] += 1
            report.failures.append(f"{step}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
            if attempt == _RERUNS:
                raise
    raise AssertionError("unreachable")


def _view(table: pa.Table) -> dict[int, tuple[str, float]]:
    out: dict[int, tuple[str, float]] = {}
    for r in table.select(["id", "name", "score"]).to_pylist():
        if r["id"] in out:
            raise AssertionError(f"primary key {r['id']} appears twice: a row applied twice")
        out[r["id"]] = (r["name"], r["score"])
    return out


def _check(report: SoakReport, uri: str, options: dict[str, str], regions: list[str],
           model: dict[int, tuple[str, float]], merged_before: dict[str, int]) -> dict[str, int]:
    """The invariants after one cycle; returns the merged generations for the next cycle's check."""
    store = ObjectStore(uri, options)
    where = f"cycle {report.cycles}"
    for region in regions:
        m = load_latest_manifest(store, region)
        gens = [fg.generation for fg in m.flushed_generations]
        if gens != sorted(set(gens)):
            report.divergences.append(f"{where}: region {region} lists generations {gens} (one twice)")
    merged = dict(load_index(uri, options).details.merged_generations)
    for region in regions:
        if merged.get(region, 0) < merged_before.get(region, 0):
            report.divergences.append(f"{where}: merged_generations of {region} went back")
        flushed = load_latest_manifest(store, region).current_generation - 1
        if merged.get(region, 0) != flushed:
            report.divergences.append(f"{where}: region {region} merged up to {merged.get(region, 0)}, flushed "
                                      f"up to {flushed}: the merge left a generation behind")
    view = _view(LsmReader(MemWalTable(uri, options)).scan())
    lost = [k for k in model if k not in view]
    report.rows_lost += len(lost)
    if view != model:
        wrong = sorted(k for k in set(view) | set(model) if view.get(k) != model.get(k))
        report.divergences.append(f"{where}: LSM view differs from the model at keys {wrong[:10]} "
                                  f"({len(lost)} lost)")
    reader = LsmReader(MemWalTable(uri, options))
    for key in sorted(model)[:3]:
        got = reader.get(key)
        if got is None or (got["name"], got["score"]) != model[key]:
            report.divergences.append(f"{where}: get({key}) = {got}, model {model[key]}")
    return merged


# Faults planned in every cycle on top of the rates, so each cycle certainly meets them (the rates' draws
# decide which other requests fail): (fault, request kind, key regex). Besides these, each writer session's
# claim and its flush lose the answer to their region manifest create (planned right before each).
MANIFEST = r"/manifest/[01]+\.binpb$"
FORCED = (
    ("lost", "PUT", r"/wal/[01]+\.arrow$"),  # a WAL entry create, the same
    ("lost", "PUT", r"/_locks/"),  # the MemWAL index lock's create (the merge takes it)
    ("lost", "PUT", r"/_versions/"),  # a Lance manifest commit (a flush's generation or the merge)
    ("503", "LIST", None),
    ("reset", "GET", None),
)


def run(upstream: str, *, cycles: int = 3, regions: int = 2, seed: int = 0,
        rates: dict[str, float] | None = None, stall_s: float = 0.05, forced: bool = True,
        maintenance: bool = False) -> SoakReport:
    """The soak against the S3 endpoint `upstream` (moto), through a fault proxy at `rates` (plus the FORCED
    faults in every cycle unless `forced` is False); with `maintenance`, a snapshot refresh and a GC run
    follow each merge."""
    import boto3
    import lance

    report = SoakReport()
    started = time.monotonic()
    bucket = f"soak-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=upstream, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket=bucket)
    clean = {"aws_endpoint": upstream, "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
             "aws_region": "us-east-1", "allow_http": "true"}
    uri = f"s3://{bucket}/table"
    lance.write_dataset(rows(range(5), "base"), uri, storage_options=clean)
    lance.dataset(uri, storage_options=clean).initialize_mem_wal(unsharded=True)
    model = {r["id"]: (r["name"], r["score"]) for r in rows(range(5), "base").to_pylist()}
    region_ids = [str(uuid.uuid4()) for _ in range(regions)]
    merged: dict[str, int] = {}
    with FaultProxy(upstream, rates=rates if rates is not None else DEFAULT_RATES, seed=seed,
                    stall_s=stall_s) as proxy:
        options = proxy.options(clean)
        for cycle in range(1, cycles + 1):
            report.cycles = cycle
            for kind, method, key in FORCED if forced else ():
                proxy.plan(kind, method=method, key=key)
            for r, region in enumerate(region_ids):
                base = 1000 * (r + 1)
                puts = rows([base + cycle, base + 100 + cycle, base + (cycle % 3)], f"c{cycle}r{r}")
                gone = [base + cycle - 1] if cycle > 1 else []
                _write(report, uri, options, region, puts, gone, proxy if forced else None)
                model.update({x["id"]: (x["name"], x["score"]) for x in puts.to_pylist()})
                for k in gone:
                    model.pop(k, None)
            _rerun(report, "merge", lambda: _merge(uri, options))
            if maintenance:
                _rerun(report, "snapshot", lambda: refresh_snapshot(MemWalTable(uri, options)))
                _rerun(report, "gc", lambda: _gc(uri, options))
            before = dict(merged)
            merged = _rerun(report, "search", lambda b=before: _check(report, uri, options, region_ids, model, b))
            if proxy.pending():
                report.divergences.append(f"cycle {cycle}: {proxy.pending()} forced fault(s) found no request")
        report.faults.update(proxy.injected)
        report.requests.update(proxy.requests)
    report.seconds = time.monotonic() - started
    return report


def _write(report: SoakReport, uri: str, options: dict[str, str], region: str, puts: pa.Table,
           deletes: list[int], proxy: FaultProxy | None) -> None:
    """One writer session: claim, put, delete, flush; any failed step reruns the session (idempotent). With
    `proxy`, the claim's and the flush's region manifest creates each lose their answer."""

    def session() -> None:
        if proxy is not None:
            proxy.plan("lost", method="PUT", key=MANIFEST)
        with RegionWriter(uri, region, storage_options=options, config=_NEVER) as w:
            w.put(puts)
            if deletes:
                w.delete(pa.table({"id": pa.array(deletes, pa.int64())}))
            if proxy is not None:
                proxy.plan("lost", method="PUT", key=MANIFEST)
            w.flush()

    _rerun(report, "write", session)


def _merge(uri: str, options: dict[str, str]) -> None:
    summary = merge_table(MemWalTable(uri, options))
    failed = [r for r in summary.regions if r.error]
    if failed:
        raise RuntimeError(f"merge failed for {len(failed)} region(s): {failed[0].error}")


def _gc(uri: str, options: dict[str, str]) -> None:
    summary = gc_table(MemWalTable(uri, options), config=GcConfig(keep_manifest_versions=2))
    failed = [r for r in summary.regions if r.error]
    if failed:
        raise RuntimeError(f"gc failed for {len(failed)} region(s): {failed[0].error}")


def _parse_rates(text: str) -> dict[str, float]:
    out = {}
    for part in filter(None, text.split(",")):
        kind, _, share = part.partition("=")
        if kind not in KINDS:
            raise SystemExit(f"unknown fault kind {kind!r} in --rates; known: {', '.join(KINDS)}")
        out[kind] = float(share)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--regions", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-forced", action="store_true", help="only the rates (no FORCED faults per cycle)")
    parser.add_argument("--maintenance", action="store_true", help="a snapshot refresh and a GC after each merge")
    parser.add_argument("--rates", default=",".join(f"{k}={v}" for k, v in DEFAULT_RATES.items()),
                        help="fault shares per request, e.g. 503=0.05,500=0.02,reset=0.01,lost=0.01,stall=0.01")
    parser.add_argument("--stall-s", type=float, default=0.05, help="how long a stalled request waits (seconds)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from ports import free_port

    from support import atomic_moto

    proc, endpoint = atomic_moto.start(free_port())
    try:
        report = run(endpoint, cycles=args.cycles, regions=args.regions, seed=args.seed,
                     rates=_parse_rates(args.rates), forced=not args.no_forced, maintenance=args.maintenance,
                     stall_s=args.stall_s)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    print(json.dumps(report.to_dict(), indent=1))
    for line in report.failures:
        print("rerun after:", line)
    return 1 if report.divergences or report.rows_lost else 0


if __name__ == "__main__":
    sys.exit(main())
