"""Test helper: LanceDB 0.40 (its own embedded Lance 13) as a peer writer and reader of a MemWAL table.

LanceDB makes the table, marks the key (`set_unenforced_primary_key`, which writes only the
`:position` marker) and installs an LSM write spec; its `merge_insert` then goes to the MemWAL. Each call
must target one shard and a table handle holds one shard writer, so a round opens one handle per
shard; `close_lsm_writers()` flushes one generation per shard. A dict model says what the table holds.
Every call passes the location's storage options explicitly (nothing is read from os.environ).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta

import lance
import lancedb
import pyarrow as pa
from lancedb import LsmWriteSpec

from memwal.catchup import catchup_table
from memwal.compaction import compact_table
from memwal.field_ids import source_names_from_schema
from memwal.gc import GcConfig, gc_table
from memwal.maintenance_config import CompactionConfig, RetentionConfig
from memwal.mem_wal_index import load_index
from memwal.merge import Dedup, local_dedup, merge_table
from memwal.naming import MEM_WAL_DIR
from memwal.region_manifest import list_regions, load_latest_manifest
from memwal.retention import retain_versions
from memwal.snapshot import read_snapshot, refresh_snapshot
from memwal.storage import lance_storage_options
from memwal.table import MemWalTable
from memwal.transforms import route

from support.vector_model import DIM, PARTITIONS, text_of, vector_column

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("grp", pa.int64()),  # id % 3: the identity spec shards by it, so a key stays in one shard
    pa.field("val", pa.string()),
])
SPECS = {
    "bucket": lambda: LsmWriteSpec.bucket("id", 4),
    "identity": lambda: LsmWriteSpec.identity("grp"),
    "unsharded": LsmWriteSpec.unsharded,
}
INDEX = "val_idx"  # the BTREE index on `val` that LanceDB maintains in its generations when asked
VECTOR_INDEX, FTS_INDEX = "vec_idx", "text_idx"  # on a vector table (`vector=True`): IVF_PQ and FTS
VECTOR_SCHEMA = pa.schema([*SCHEMA, pa.field("text", pa.string()), pa.field("vec", pa.list_(pa.float32(), DIM))])


def rows(ids: Sequence[int], tag: str, vector: bool = False) -> pa.Table:
    """Rows tagged `tag`; with `vector`, also the text and vector of each val (tests/support/vector_model.py)."""
    ids = list(ids)
    vals = [f"{tag}-{i}" for i in ids]
    if vector:
        return pa.table({"id": ids, "grp": [i % 3 for i in ids], "val": vals, "text": [text_of(v) for v in vals],
                         "vec": vector_column(vals)}, schema=VECTOR_SCHEMA)
    return pa.table({"id": ids, "grp": [i % 3 for i in ids], "val": vals}, schema=SCHEMA)


class LanceDbTable:
    """Table `t` of a LanceDB database at `loc` (the MemWAL table itself is `self.table`, a Location)."""

    def __init__(self, loc, name: str = "t"):
        self.db = loc
        self.name = name
        self.table = loc.child(f"{name}.lance")
        self.model: dict[int, dict] = {}
        self.vector = False

    # -- LanceDB calls (async API; one event loop per call) -------------------------------------------

    async def _connect(self):
        return await lancedb.connect_async(self.db.uri, storage_options=self.db.storage_options or None)

    def _run(self, fn):
        async def go():
            return await fn(await self._connect())

        return asyncio.run(go())

    def create(self, spec: str, base_ids: Sequence[int] = range(20), maintained_index: bool = False,
               vector: bool = False) -> None:
        """create_table, an optional BTREE index on val, set_unenforced_primary_key("id"), the LSM spec.
        vector: text and vector columns too, with an IVF_PQ and an FTS index, all three maintained."""
        base = rows(base_ids, "base", vector)
        self.vector = vector

        async def go(db):
            t = await db.create_table(self.name, base)
            maintained = []
            if maintained_index or vector:
                await t.create_index("val", config=lancedb.index.BTree())
                maintained.append(INDEX)
            if vector:  # 4-bit PQ codes: trained on 16 rows and more (tests/support/vector_model.py)
                await t.create_index("vec", name=VECTOR_INDEX, config=lancedb.index.IvfPq(
                    num_partitions=PARTITIONS, num_sub_vectors=2, num_bits=4))
                await t.create_index("text", name=FTS_INDEX, config=lancedb.index.FTS())
                maintained += [VECTOR_INDEX, FTS_INDEX]
            await t.set_unenforced_primary_key("id")
            lsm = SPECS[spec]()
            await t.set_lsm_write_spec(lsm.with_maintained_indexes(maintained) if maintained else lsm)

        self._run(go)
        self._note(base)

    def shard_groups(self, table: pa.Table) -> dict[tuple, pa.Table]:
        """The rows split by the table's region spec, routed by OUR region_spec code (LanceDB refuses a
        call whose rows hash to two buckets, so this also checks our bucket hash against LanceDB's)."""
        details = load_index(self.table.uri, self.table.storage_options).details
        spec = details.region_spec(details.newest_region_spec_id)
        schema = lance.dataset(self.table.uri, storage_options=lance_storage_options(self.table.storage_options)).schema
        return route(spec, table, source_names_from_schema(schema))

    def write_round(self, batches: Sequence[pa.Table]) -> None:
        """Each batch is upserted in turn (merge_insert on id) through one handle per shard, then
        close_lsm_writers flushes one generation per shard: a key in two batches is written twice
        inside one generation."""
        per_shard: dict[tuple, list[pa.Table]] = {}
        for batch in batches:
            for shard, part in self.shard_groups(batch).items():
                per_shard.setdefault(shard, []).append(part)

        async def go(db):
            for parts in per_shard.values():
                t = await db.open_table(self.name)
                for part in parts:
                    await (t.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
                           .execute(part))
                await t.close_lsm_writers()

        self._run(go)
        for b in batches:
            self._note(b)

    def query(self, where: str | None = None) -> list[dict]:
        """LanceDB's own LSM read (base table + flushed generations), sorted by id."""

        async def go(db):
            q = (await db.open_table(self.name)).query()
            return await (q.where(where) if where else q).to_arrow()

        return sorted(self._run(go).select(SCHEMA.names).to_pylist(), key=lambda r: r["id"])

    def count_rows(self) -> int:
        """LanceDB's count_rows (it counts the base table only)."""

        async def go(db):
            return await (await db.open_table(self.name)).count_rows()

        return self._run(go)

    def nearest_base(self, q, k: int, exact: bool, refine_factor: int = 1) -> list[tuple[float, int]]:
        """LanceDB's vector search on the base table (`use_lsm(False)`: see LANCE-MAINTENANCE-NOTES.md),
        exact (`bypass_vector_index`) or ANN probing every partition with refinement: (distance, id) pairs."""

        async def go(db):
            v = (await db.open_table(self.name)).query().nearest_to(q).column("vec").use_lsm(False).limit(k)
            v = v.bypass_vector_index() if exact else v.nprobes(PARTITIONS).refine_factor(refine_factor)
            return await v.select(["id"]).to_arrow()

        t = self._run(go)
        return list(zip(t.column("_distance").to_pylist(), t.column("id").to_pylist(), strict=True))

    def fts_base(self, word: str) -> list[int]:
        """LanceDB's full-text search of one word on the base table: the ids found."""

        async def go(db):
            q = (await db.open_table(self.name)).query().nearest_to_text(word, columns="text").use_lsm(False)
            return await q.select(["id"]).limit(10_000).to_arrow()

        return sorted(self._run(go).column("id").to_pylist())

    def search_plans(self, q, word: str) -> tuple[str, str]:
        """LanceDB's plans of an ANN search (every partition probed) and an FTS query on the base table."""

        async def go(db):
            t = await db.open_table(self.name)
            ann = t.query().nearest_to(q).column("vec").use_lsm(False).nprobes(PARTITIONS).refine_factor(10)
            return (await ann.explain_plan(),
                    await t.query().nearest_to_text(word, columns="text").use_lsm(False).explain_plan())

        return self._run(go)

    def index_stats(self, name: str):
        """LanceDB's index_stats of one index (IndexStatistics: num_indexed_rows, num_unindexed_rows, ...)."""

        async def go(db):
            return await (await db.open_table(self.name)).index_stats(name)

        return self._run(go)

    # -- the model and our view of the files -------------------------------------------------------------

    def _note(self, table: pa.Table) -> None:
        for r in table.select(SCHEMA.names).to_pylist():
            self.model[r["id"]] = r

    def expected(self) -> list[dict]:
        return [self.model[k] for k in sorted(self.model)]

    def base_rows(self) -> list[dict]:
        ds = lance.dataset(self.table.uri, storage_options=lance_storage_options(self.table.storage_options))
        return sorted(ds.to_table(columns=SCHEMA.names).to_pylist(), key=lambda r: r["id"])

    def flushed_max(self) -> dict[str, int]:
        store = self.table.store()
        return {r: max((g.generation for g in load_latest_manifest(store, r).flushed_generations), default=0)
                for r in list_regions(store)}

    def expire_old_versions(self) -> None:
        """What a table owner's cleanup does; GC keeps generations that a retained version still needs."""
        ds = lance.dataset(self.table.uri, storage_options=lance_storage_options(self.table.storage_options))
        ds.cleanup_old_versions(older_than=timedelta(0))


def round_batches(r: int, vector: bool = False) -> list:
    """Round r: new keys and updates of base keys, then a second upsert of some of the same keys, which
    LanceDB writes into the same generation (the older row masked through the generation's _deletions/)."""
    new = list(range(100 * (r + 1), 100 * (r + 1) + 12))
    return [rows([*new, r, r + 5], f"r{r}a", vector), rows([*new[:5], r], f"r{r}b", vector)]


def deletion_files(t: LanceDbTable) -> list[str]:
    return [m.path for m in t.table.store().list(MEM_WAL_DIR) if "/_deletions/" in m.path]


def generation_dirs(t: LanceDbTable) -> set[str]:
    return {m.path.split("/")[2] for m in t.table.store().list(MEM_WAL_DIR) if "_gen_" in m.path}


def merge_and_maintain(t: LanceDbTable, dedup: Dedup = local_dedup, compact: bool = False) -> dict:
    """memwal merge (in process, or with a Spark dedup hook) -> catch-up -> (compact: forced compaction and
    version retention) -> snapshot -> GC (after the owner expired old table versions); each job's summary."""
    uri, opts = t.table.uri, t.table.storage_options
    summary = merge_table(MemWalTable(uri, opts), dedup=dedup)
    assert not summary.failed_regions, summary.to_dict()
    assert t.base_rows() == t.expected(), "the merged base table must equal the model"
    assert load_index(uri, opts).merged_generations == t.flushed_max(), "every flushed generation merged"
    catchup = catchup_table(MemWalTable(uri, opts)).to_dict()
    assert not catchup["failed_indexes"], catchup
    out = {}
    if compact:
        compaction = compact_table(MemWalTable(uri, opts), CompactionConfig(force=True)).to_dict()
        assert compaction["error"] is None, compaction
        out["compaction"] = compaction
        retain_versions(MemWalTable(uri, opts), RetentionConfig(older_than_s=0, keep_versions=2))
    refresh_snapshot(MemWalTable(uri, opts))
    assert read_snapshot(MemWalTable(uri, opts)).num_rows == len(t.flushed_max())
    t.expire_old_versions()
    gc = gc_table(MemWalTable(uri, opts), config=GcConfig(keep_manifest_versions=2)).to_dict()
    assert not gc["failed_regions"], gc
    return {"merge": summary.to_dict(), "catchup": catchup, "gc": gc, **out}
