"""Helpers of the Spark tests: a two-region MemWAL table with updates and deletes over several
generations, and the rows a reader sees."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pyarrow as pa

from memwal.reader import LsmReader
from memwal.storage import ObjectStore
from memwal.table import MemWalTable
from memwal.writer import RegionWriter, WriterConfig

from support.jvm import FAST_JVM
from support.tables import create_base, open_base, rows, sorted_rows

ONE_GEN_PER_FLUSH = WriterConfig(max_memtable_rows=10**9, max_flush_interval_s=None)



def staging_spark_dedup(app: str, master: str = "local[1]"):
    """For the child processes of the crash and race tests: a SparkSession on `master` with its Python
    workers started, and the Spark dedup hook with every region batch staged as files (none inline)."""
    from spark_jobs.common import build_spark
    from spark_jobs.merge_dedup import spark_dedup, warm_up

    spark, _ = build_spark(app, master=master, conf=FAST_JVM)
    warm_up(spark)
    return spark_dedup(spark, inline_bytes=0)

# (put ids, tag, delete ids), one flushed generation each; ids are offset per region.
GENS = [
    ([1, 2, 11, 12, 13], "g1", [3]),
    ([2, 3], "g2", [11]),  # re-inserts 3, deletes 11 from generation 1
    ([4], "g3", [1, 4]),  # inserts then deletes 4 in one generation: the later row (tombstone) wins
    ([1, 12], "g4", [5]),  # deletes a base row
    (list(range(20, 60)), "g5", [13]),
]


def build_table(loc, n_regions: int = 2, gens=GENS) -> list[str]:
    """Base rows 0..9, then n_regions regions writing `gens`; region k's keys are offset by 100*k (region 0
    updates and deletes base rows). Returns the region ids."""
    create_base(loc, ids=range(10))
    open_base(loc).initialize_mem_wal(unsharded=True)
    regions = []
    for k in range(n_regions):
        region = str(uuid.uuid4())
        regions.append(region)
        off = 100 * k
        with RegionWriter(loc.uri, region, storage_options=loc.storage_options, config=ONE_GEN_PER_FLUSH) as w:
            for put_ids, tag, delete_ids in gens:
                if put_ids:
                    w.put(rows([i + off for i in put_ids], tag))
                if delete_ids:
                    w.delete(pa.table({"id": pa.array([i + off for i in delete_ids], pa.int64())}))
                w.flush()
    return regions


def lsm_view(loc) -> list[dict]:
    return sorted_rows(LsmReader(MemWalTable(loc.uri, loc.storage_options)).scan())


def base_rows(loc) -> list[dict]:
    return sorted_rows(open_base(loc).to_table())


@dataclass(frozen=True)
class Loc:
    """A table location (the same shape as tests/conftest.py's Location)."""

    uri: str
    storage_options: dict[str, str] | None = None
    kind: str = "local"

    def store(self) -> ObjectStore:
        return ObjectStore(self.uri, self.storage_options)
