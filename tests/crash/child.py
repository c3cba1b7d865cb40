"""Child process for the crash tests: runs one scenario against a table and prints, line by line and
flushed, a JSON record of every acknowledged operation before going on. With MEMWAL_FAULT=<fault point>
in its environment the library SIGKILLs this process at that point (memwal.faults).

    python child.py '{"scenario": "write", "uri": ..., "storage_options": ..., "ops": [...]}'

Scenarios: write (ops: {"op": put|delete|flush|close, "region": id, "rows": [[id, name, score], ...],
"keys": [id, ...]}), merge ("spark": true: deduplicated on Spark, local[1], staged as files; "apply":
MergeConfig.apply, "parallelism": the fragment apply's tasks),
snapshot (inline_threshold), catchup, catchup_tasks (segments built as tasks), gc (keep).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the shared helpers
from support.tables import SCHEMA


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def run(spec: dict) -> None:
    from memwal.table import MemWalTable

    uri, so = spec["uri"], spec.get("storage_options")
    scenario = spec["scenario"]
    if scenario == "write":
        from memwal.writer import RegionWriter, WriterConfig

        config = WriterConfig(max_memtable_rows=10**9, max_memtable_bytes=10**12, max_flush_interval_s=None)
        writers: dict[str, RegionWriter] = {}
        for op in spec["ops"]:
            region = op["region"]
            if region not in writers:
                writers[region] = RegionWriter(uri, region, storage_options=so, config=config)
            w = writers[region]
            if op["op"] == "put":
                ids, names, scores = zip(*op["rows"], strict=True)
                w.put(pa.table({"id": list(ids), "name": list(names), "score": list(scores)}, schema=SCHEMA))
            elif op["op"] == "delete":
                w.delete(pa.table({"id": pa.array(op["keys"], pa.int64())}))
            elif op["op"] == "flush":
                w.flush()
            elif op["op"] == "close":
                writers.pop(region).close()
            emit({"ack": op})
    elif scenario == "merge":
        from memwal.merge import MergeConfig, local_dedup, merge_table

        dedup = local_dedup
        if spec.get("spark"):
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "spark"))
            from spark_helpers import staging_spark_dedup

            dedup = staging_spark_dedup("crash-merge")
        config = MergeConfig(max_generations_per_commit=spec.get("generations_per_commit", 1),
                             max_bytes_per_commit=spec.get("bytes_per_commit", MergeConfig().max_bytes_per_commit),
                             apply=spec.get("apply", "auto"))
        summary = merge_table(MemWalTable(uri, so), config=config, dedup=dedup, parallelism=spec.get("parallelism", 1))
        emit({"merge": summary.to_dict()["failed_regions"]})
    elif scenario == "snapshot":
        from memwal.snapshot import refresh_snapshot

        refresh_snapshot(MemWalTable(uri, so), inline_threshold=spec.get("inline_threshold", 100))
    elif scenario == "catchup":
        from memwal.catchup import catchup_table

        catchup_table(MemWalTable(uri, so))
    elif scenario == "catchup_tasks":  # index segments built as tasks over fragment groups (memwal.index_build)
        from memwal.catchup import DistributedBuild, catchup_table
        from memwal.task_runner import in_process

        catchup_table(MemWalTable(uri, so), distributed=DistributedBuild(in_process, groups=2, where="tasks",
                                                                         min_rows=0, min_group_rows=1))
    elif scenario == "gc":
        from memwal.gc import GcConfig, gc_table

        gc_table(MemWalTable(uri, so), config=GcConfig(grace_period_s=0, keep_manifest_versions=spec.get("keep", 1)))
    elif scenario == "compaction":
        from memwal.compaction import CompactionConfig, compact_table

        compact_table(MemWalTable(uri, so),
                      CompactionConfig(force=True, target_rows_per_fragment=spec.get("target_rows", 1000)))
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    emit({"done": scenario})


if __name__ == "__main__":
    run(json.loads(sys.argv[1]))
