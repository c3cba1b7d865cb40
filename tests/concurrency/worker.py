"""Worker processes for the race tests. Each waits until `start_at` (wall clock), loops until `stop_at`,
and prints one JSON line (flushed) per acknowledged write or finished job run.

    python worker.py '{"role": "writer", "uri": ..., "storage_options": ..., "start_at": t, "stop_at": t, ...}'

Roles:
- writer: puts/deletes on `keys` (routed to `regions` by key % len(regions)) and flushes (a put and a
  flush first); every acknowledged operation is printed before the next one starts; closes its writers.
- merger: merge_table in a loop (random generations per commit); with "spark": true, deduplicated on Spark
  (local[1], the session started before the common start time). With "force_conflict": true its first run
  is made to conflict (see _forced_conflict) and the other mergers wait for it (go_file).
- snapshot: refresh_snapshot (inline) alternating with catchup_table.
- gc: version retention (memwal.retention: older than cleanup_s, keep 1) then gc_table in a loop; past
  stop_at, until it has deleted a generation.
- compactor: forced compaction (memwal.compaction) in a loop, holding the MemWAL index lock or not in turn;
  past stop_at, until it has committed a task (the mergers' commits add fragments, so that is certain).
- fighter: claims `region`, waits until both fighters claimed, writes and flushes (the older claim is
  certain to be fenced); when fenced, claims again. Prints its epoch with every flush and every fence.
Every loop runs at least once, even when the worker starts after stop_at.
"""

from __future__ import annotations

import json
import random
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the shared helpers
from support.tables import SCHEMA


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def _table(ids: list[int], tag: str, score: float) -> pa.Table:
    return pa.table({"id": ids, "name": [f"{tag}.{i}" for i in ids], "score": [score] * len(ids)}, schema=SCHEMA)


def writer(spec: dict, rng: random.Random) -> None:
    from memwal.writer import RegionWriter, WriterConfig

    uri, so, regions, keys = spec["uri"], spec.get("storage_options"), spec["regions"], spec["keys"]
    config = WriterConfig(max_memtable_rows=10**9, max_memtable_bytes=10**12, max_flush_interval_s=None)
    writers = [RegionWriter(uri, r, storage_options=so, config=config) for r in regions]
    n = 0
    while n < 2 or time.time() < spec["stop_at"]:  # a put and a flush first, even when it started late
        n += 1
        ri = rng.randrange(len(regions))
        mine = [k for k in keys if k % len(regions) == ri]
        roll = {1: 0.0, 2: 1.0}.get(n, rng.random())
        if roll < 0.6:
            ids = rng.sample(mine, rng.randint(1, 3))
            writers[ri].put(_table(ids, f"w{n}", float(n)))
            emit({"op": "put", "ids": ids, "tag": f"w{n}", "score": float(n)})
        elif roll < 0.8:
            ids = rng.sample(mine, rng.randint(1, 2))
            writers[ri].delete(pa.table({"id": pa.array(ids, pa.int64())}))
            emit({"op": "delete", "ids": ids})
        else:
            writers[ri].flush()
            emit({"op": "flush", "region": regions[ri]})
        time.sleep(rng.uniform(0, 0.02))
    for w in writers:
        w.close()
    emit({"op": "closed"})


def _guarded(job: str, fn) -> None:
    """Run one job iteration; an exception is reported (the test decides) and the loop goes on."""
    try:
        fn()
    except Exception as exc:
        emit({"job": job, "exception": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
              "errors": []})


def merger(spec: dict, rng: random.Random) -> None:
    from memwal.merge import MergeConfig, local_dedup, merge_table
    from memwal.table import MemWalTable

    dedup = PREPARED.get("dedup", local_dedup)
    engine = "spark" if "dedup" in PREPARED else "local"

    def once(forced: bool = False) -> None:
        config = MergeConfig(max_generations_per_commit=rng.randint(1, 3), apply=spec.get("apply", "auto"))
        summary = merge_table(MemWalTable(spec["uri"], spec.get("storage_options")), config=config, dedup=dedup,
                              parallelism=2)
        emit({"job": "merge", "engine": engine, "apply": config.apply, "commits": summary.commits,
              "conflicts": sum(r.conflicts for r in summary.regions), "forced_conflict": forced,
              "errors": [r.error for r in summary.regions if r.error]})

    if spec.get("force_conflict"):
        _forced_conflict(spec, lambda: once(forced=True))
    else:
        _wait_for(spec["go_file"])
    runs = 0
    while runs == 0 or time.time() < spec["stop_at"]:  # at least one run, even when it started late
        runs += 1
        _guarded("merge", once)
        time.sleep(rng.uniform(0, 0.05))


def _wait_for(path: str | None) -> None:
    """A barrier on a file (state, not time): the other mergers start once the forced conflict happened."""
    while path and not Path(path).exists():
        time.sleep(0.01)


def _forced_conflict(spec: dict, run: Callable[[], None]) -> None:
    """The first merge run, certain to conflict: right before its first commit (fault point
    merge.before_commit) another merge_table merges the same generations, so that commit is refused as a
    stale marker and retried. No other merger has started yet (they wait for go_file), so the setup's
    unmerged generations are certain to be planned."""
    import memwal.merge as merge_mod
    from memwal.merge import merge_table
    from memwal.table import MemWalTable

    real = merge_mod.fault_point
    fired: list[str] = []

    def point(name: str) -> None:
        if name == "merge.before_commit" and not fired:
            fired.append(name)
            merge_table(MemWalTable(spec["uri"], spec.get("storage_options")))  # the other merger, first to commit
        real(name)

    merge_mod.fault_point = point
    try:
        run()
    finally:
        merge_mod.fault_point = real
        Path(spec["go_file"]).touch()
    assert fired, "the forced conflict did not fire: nothing was planned"


def prepare_spark_merger() -> None:
    """Before the common start: a local[1] SparkSession; the merger then deduplicates every round on Spark
    and stages every region batch as files (on S3 in the S3 race)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "spark"))
    from spark_helpers import staging_spark_dedup

    PREPARED["dedup"] = staging_spark_dedup("race-merger")


def snapshot(spec: dict, rng: random.Random) -> None:
    from memwal.catchup import catchup_table
    from memwal.snapshot import refresh_snapshot
    from memwal.table import MemWalTable

    def snap() -> None:
        s = refresh_snapshot(MemWalTable(spec["uri"], spec.get("storage_options")), inline_threshold=100)
        emit({"job": "snapshot", "regions": s.num_regions, "version": s.table_version, "errors": []})

    def catch_up() -> None:
        c = catchup_table(MemWalTable(spec["uri"], spec.get("storage_options")))
        emit({"job": "catchup", "errors": [x.error for x in c.indexes if x.error]})

    i = 0
    while i < 2 or time.time() < spec["stop_at"]:  # a snapshot and a catch-up, even when it started late
        i += 1
        _guarded("snapshot" if i % 2 else "catchup", snap if i % 2 else catch_up)
        time.sleep(rng.uniform(0, 0.05))


def gc(spec: dict, rng: random.Random) -> None:
    from memwal.catchup import catchup_table
    from memwal.gc import GcConfig, gc_table
    from memwal.retention import RetentionConfig, retain_versions
    from memwal.table import MemWalTable

    deleted_generations = 0

    def once(closing: bool) -> None:
        nonlocal deleted_generations
        if closing:  # the snapshot worker may have stopped before catching up the last merge
            catchup_table(MemWalTable(spec["uri"], spec.get("storage_options")))
        retain_versions(MemWalTable(spec["uri"], spec.get("storage_options")),
                        RetentionConfig(older_than_s=spec.get("cleanup_s", 2.0), keep_versions=1))
        s = gc_table(MemWalTable(spec["uri"], spec.get("storage_options")),
                     config=GcConfig(grace_period_s=spec.get("grace_period_s", 30.0), keep_manifest_versions=3))
        kinds: dict[str, int] = {}
        for a in s.actions:
            kinds[a.kind] = kinds.get(a.kind, 0) + 1
        deleted_generations += kinds.get("generation", 0)
        emit({"job": "gc", "deleted": kinds, "closing": closing, "errors": [r.error for r in s.regions if r.error]})

    # After stop_at it goes on (with its own catch-up) until it has deleted a generation: the setup's merged
    # generations are past the grace period, so that is certain, not a matter of timing.
    while time.time() < spec["stop_at"] or not deleted_generations:
        _guarded("gc", lambda: once(closing=time.time() >= spec["stop_at"]))
        time.sleep(rng.uniform(0.05, 0.2))


def compactor(spec: dict, rng: random.Random) -> None:
    from memwal.compaction import CompactionConfig, compact_table
    from memwal.table import MemWalTable

    committed = 0
    i = 0

    def once(use_lock: bool) -> None:
        nonlocal committed
        s = compact_table(MemWalTable(spec["uri"], spec.get("storage_options")),
                          CompactionConfig(force=True, target_rows_per_fragment=1000, use_lock=use_lock))
        committed += s.tasks_committed
        emit({"job": "compaction", "use_lock": use_lock, "tasks": s.tasks_committed, "preempted": s.tasks_preempted,
              "preempted_commits": s.preempted_commits, "errors": []})

    while time.time() < spec["stop_at"] or not committed:
        i += 1
        _guarded("compaction", lambda lock=i % 2 == 1: once(use_lock=lock))
        time.sleep(rng.uniform(0.05, 0.2))


def fighter(spec: dict, rng: random.Random) -> None:
    from memwal.errors import FencedError, WriterClosedError
    from memwal.writer import RegionWriter, WriterConfig

    uri, so, region, keys = spec["uri"], spec.get("storage_options"), spec["region"], spec["keys"]
    config = WriterConfig(max_memtable_rows=10**9, max_memtable_bytes=10**12, max_flush_interval_s=None)
    def claim() -> RegionWriter:
        while True:  # a claim is fenced itself when the other writer claims again while it replays
            try:
                w = RegionWriter(uri, region, storage_options=so, config=config)
            except FencedError as exc:
                emit({"claim_fenced": exc.local_epoch})
                continue
            emit({"claimed": w.writer_epoch})
            return w

    w = claim()
    # Certain fence: once both fighters have claimed (stored epoch >= 2), each puts and flushes first; the
    # older claim's flush is fenced whatever the timing.
    from memwal.region_manifest import load_latest_manifest
    from memwal.storage import ObjectStore

    store = ObjectStore(uri, so)
    while load_latest_manifest(store, region).writer_epoch < 2:
        time.sleep(0.01)
    n = 0
    while n < 2 or time.time() < spec["stop_at"]:
        n += 1
        try:
            if {1: 0.0, 2: 1.0}.get(n, rng.random()) < 0.7:
                ids = rng.sample(keys, rng.randint(1, 2))
                w.put(_table(ids, f"{spec['name']}{n}", float(n)))
                emit({"op": "put", "ids": ids, "tag": f"{spec['name']}{n}", "score": float(n), "epoch": w.writer_epoch})
            else:
                flushed = w.flush()
                if flushed is not None:
                    emit({"op": "flush", "epoch": w.writer_epoch, "version": w.manifest.version,
                          "manifest_epoch": w.manifest.writer_epoch, "generation": flushed.generation})
        except (FencedError, WriterClosedError) as exc:
            emit({"fenced": w.writer_epoch, "error": type(exc).__name__})
            w = claim()
        time.sleep(rng.uniform(0, 0.01))
    try:
        w.close()
        emit({"op": "closed", "epoch": w.writer_epoch})
    except (FencedError, WriterClosedError) as exc:
        emit({"fenced": w.writer_epoch, "error": f"{type(exc).__name__} at close"})


ROLES = {"writer": writer, "merger": merger, "snapshot": snapshot, "gc": gc, "compactor": compactor,
         "fighter": fighter}


PREPARED: dict = {}


def main() -> None:
    spec = json.loads(sys.argv[1])
    rng = random.Random(spec.get("seed"))
    if spec.get("spark"):
        prepare_spark_merger()
    delay = spec["start_at"] - time.time()
    if delay > 0:
        time.sleep(delay)
    try:
        ROLES[spec["role"]](spec, rng)
    except BaseException as exc:
        emit({"crashed": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        raise


if __name__ == "__main__":
    main()
