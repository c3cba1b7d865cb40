"""Snapshot refresh: summarise every region manifest into the MemWAL index, reading the manifests on
the executors.

    spark-submit [spark options] /abs/path/spark_jobs/snapshot.py TABLE [--inline-threshold N]

`memwal.snapshot.refresh_snapshot` takes a `read_manifests(store, region_ids)` hook; here it is
`spark_manifest_reader(spark)`: one row per region (`spark.range`), `mapInArrow` loads each region's latest
manifest on an executor and returns its protobuf bytes, the driver decodes them. Everything else
(the snapshot rows, inline or external storage, the commit through commit_details) is the library's.
Prints one JSON line (`SnapshotSummary.to_dict()`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from memwal import jobs, naming
from memwal.errors import MemWalError
from memwal.region_manifest import RegionManifest, decode_manifest
from memwal.snapshot import ManifestReader
from memwal.storage import ObjectStore
from memwal.table import MemWalTable
from spark_jobs import common
from spark_jobs.task_runner import default_parallelism

if TYPE_CHECKING:
    from memwal.job_config import JobOptions

log = logging.getLogger(__name__)

def _manifest_task(region_ids: list[str], table: MemWalTable):
    """The executors' task: `table` arrives pickled down to its URI and storage options and opens nothing
    but its object store."""

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            ids = [region_ids[i] for i in batch.column(0).to_pylist()]
            raw = [table.manifest(r).raw for r in ids]
            yield pa.record_batch({"region_id": pa.array(ids, pa.string()), "manifest": pa.array(raw, pa.binary())})

    return read


def spark_manifest_reader(spark, max_tasks: int | None = None) -> ManifestReader:
    """A `read_manifests` hook that loads the latest region manifests in parallel on Spark."""

    def read_manifests(store: ObjectStore, region_ids: Sequence[str]) -> list[RegionManifest]:
        ids = list(region_ids)
        if not ids:
            return []
        tasks = min(len(ids), max_tasks or 4 * default_parallelism(spark, fallback=8))
        try:
            table = (
                spark.range(0, len(ids), 1, tasks)
                .mapInArrow(_manifest_task(ids, MemWalTable(store.uri, store.storage_options)),
                            "region_id string, manifest binary")
                .toArrow()
            )
        except Exception as exc:
            raise MemWalError(
                f"reading {len(ids)} region manifests on Spark failed: {common.spark_error_line(exc)}"
            ) from exc
        raw = dict(zip(table.column("region_id").to_pylist(), table.column("manifest").to_pylist(), strict=True))
        log.info("read %d region manifests on Spark in %d tasks", len(raw), tasks)
        return [decode_manifest(raw[r], naming.manifest_dir(r)) for r in ids]

    return read_manifests


DESCRIPTION = "Refresh the region snapshots in the MemWAL index."


def run(spark: Any, table: MemWalTable, options: JobOptions, regions: Sequence[str] | None) -> dict[str, Any]:
    return jobs.run_job("snapshot", table, options, regions, read_manifests=spark_manifest_reader(spark))


def main(argv: list[str] | None = None) -> int:
    return common.run_job("snapshot", run, argv, DESCRIPTION)


if __name__ == "__main__":
    sys.exit(main())
