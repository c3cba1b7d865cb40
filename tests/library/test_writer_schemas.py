"""The writer on schemas users have: NOT NULL columns, every index type, columns added, the maintained set
changing under a live writer, composite keys. Each generation flushed here is also read by Lance core."""

from __future__ import annotations

import contextlib
import uuid

import lance
import numpy as np
import pyarrow as pa
import pytest

from memwal import naming
from memwal.mem_wal_index import initialize_mem_wal
from memwal.merge import merge_table
from memwal.reader import LsmReader
from memwal.region_manifest import load_latest_manifest
from memwal.table import MemWalTable
from memwal.writer import RegionWriter, WriterConfig

from support.tables import PK, lance_core_scan

NEVER = WriterConfig(max_memtable_rows=10**9, max_flush_interval_s=None)

NOT_NULL = pa.schema([
    pa.field("id", pa.int64(), nullable=False, metadata=PK),
    pa.field("name", pa.string(), nullable=False),
    pa.field("n", pa.int32(), nullable=False),
])


def _not_null_rows(ids, tag="v") -> pa.Table:
    ids = list(ids)
    return pa.table({"id": ids, "name": [f"{tag}{i}" for i in ids], "n": [i % 7 for i in ids]}, schema=NOT_NULL)


def _ids(table: pa.Table) -> list[int]:
    return sorted(table.column("id").to_pylist())


def _not_null_table(loc) -> str:
    """A base of ids [1] with NOT NULL columns, the MemWAL initialised; a new region's id."""
    lance.write_dataset(_not_null_rows([1], "base"), loc.uri)
    initialize_mem_wal(loc.uri, None, None)
    return str(uuid.uuid4())


@contextlib.contextmanager
def _failing_bloom_filter(monkeypatch, message: str):
    """A context in which a flush fails after writing part of its generation (the bloom filter's write)."""
    from memwal import generation

    def broken(*args, **kwargs):
        raise OSError(f"injected: {message}")

    with monkeypatch.context() as m:
        m.setattr(generation, "write_bloom_filter", broken)
        yield


def test_delete_on_a_not_null_table_flushes_merges_and_reads_everywhere(local_location):
    """Base ids 1..3 with `name string not null`; put 10, delete 2 (acknowledged), flush.
    Lance core stores the delete with nulls in the non-key columns (its WAL and generation schemas relax every
    non-key column to nullable; the key stays NOT NULL): the view is [1, 3, 10] in our reader and in Lance
    core's, before and after the merge, and the base keeps its NOT NULL schema."""
    loc = local_location
    lance.write_dataset(_not_null_rows([1, 2, 3], "base"), loc.uri)
    initialize_mem_wal(loc.uri, None, None)
    region = str(uuid.uuid4())
    with RegionWriter(loc.uri, region, config=NEVER) as w:
        w.put(_not_null_rows([10]))
        w.delete(pa.table({"id": pa.array([2], pa.int64())}))
        w.flush()
    assert _ids(LsmReader(MemWalTable(loc.uri)).scan()) == [1, 3, 10], "a delete on a NOT NULL table must flush"
    assert _ids(lance_core_scan(loc)) == [1, 3, 10], "Lance core must read the delete our writer flushed"
    # a new writer of the region starts (replay of nothing left) and the region merges
    RegionWriter(loc.uri, region, config=NEVER).close()
    summary = merge_table(MemWalTable(loc.uri))
    assert not summary.failed_regions, summary.to_dict()
    base = lance.dataset(loc.uri)
    assert _ids(base.to_table()) == [1, 3, 10]
    assert not base.schema.field("name").nullable, "the merge must not relax the base's NOT NULL column"


def test_an_unflushed_delete_on_a_not_null_table_is_replayed(local_location):
    """The writer dies after an acknowledged delete: the next writer replays it (the WAL entry carries nulls in
    NOT NULL columns, as Lance core's does) and flushes it."""
    loc = local_location
    lance.write_dataset(_not_null_rows([1, 2, 3], "base"), loc.uri)
    initialize_mem_wal(loc.uri, None, None)
    region = str(uuid.uuid4())
    w = RegionWriter(loc.uri, region, config=NEVER)
    w.delete(pa.table({"id": pa.array([2], pa.int64())}))
    del w  # crash
    with RegionWriter(loc.uri, region, config=NEVER) as w2:
        assert w2.stats.replayed_entries == 1
    assert _ids(LsmReader(MemWalTable(loc.uri)).scan()) == [1, 3]


def test_a_put_with_a_null_in_a_not_null_column_is_refused_and_nothing_is_written(local_location):
    """Relaxing the WAL schema for deletes must not let a put smuggle a null into a NOT NULL column."""
    loc = local_location
    lance.write_dataset(_not_null_rows([1], "base"), loc.uri)
    initialize_mem_wal(loc.uri, None, None)
    region = str(uuid.uuid4())
    bad = pa.table({"id": pa.array([5], pa.int64()), "name": pa.array([None], pa.string()), "n": [1]})
    with RegionWriter(loc.uri, region, config=NEVER) as w:
        with pytest.raises(ValueError, match=r"'name'.*NOT NULL|NOT NULL.*'name'"):
            w.put(bad)
        assert w.stats.wal_entries == 0


# -- every index type in the maintained set ----------------------------------------------------------------

DIM = 8


def _typed_rows(ids, tag="v") -> pa.Table:
    ids = list(ids)
    vec = np.array([[(i * 7 + j) % 11 / 11.0 for j in range(DIM)] for i in ids], np.float32).reshape(-1)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "cat": [f"c{i % 5}" for i in ids],
        "tags": [[f"t{i % 3}", f"t{i % 4}"] for i in ids],
        "txt": [f"{tag} apple {i}" for i in ids],
        "num": pa.array([float(i) for i in ids]),
        "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec), DIM),
    }, schema=pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("cat", pa.string()),
                         pa.field("tags", pa.list_(pa.string())), pa.field("txt", pa.string()),
                         pa.field("num", pa.float64()), pa.field("vec", pa.list_(pa.float32(), DIM))]))


SCALAR_INDEXES = [("cat", "BITMAP"), ("tags", "LABEL_LIST"), ("cat", "NGRAM"), ("num", "ZONEMAP"),
                  ("txt", "INVERTED"), ("cat", "BLOOMFILTER"), ("num", "BTREE")]
VECTOR_INDEXES = [("IVF_PQ", {"num_partitions": 2, "num_sub_vectors": 2}), ("IVF_FLAT", {"num_partitions": 2}),
                  ("IVF_HNSW_SQ", {"num_partitions": 2})]


def test_every_index_type_in_the_maintained_set_flushes(local_location):
    """A base with every scalar type Lance offers (BITMAP, LABEL_LIST, NGRAM, ZONEMAP, INVERTED, BLOOMFILTER,
    BTREE) and every vector type (IVF_PQ, IVF_FLAT, IVF_HNSW_SQ), "maintain all indexes" as Lance core's
    initialize_mem_wal() sets it: a flush builds each on the generation (LabelList included: describe_indices
    says 'LabelList', create_scalar_index wants 'LABEL_LIST'), the MemTable empties, and our reader and Lance
    core's read the rows."""
    loc = local_location
    ds = lance.write_dataset(_typed_rows(range(300), "base"), loc.uri)
    for column, kind in SCALAR_INDEXES:
        ds.create_scalar_index(column, kind, name=f"{column}_{kind.lower()}")
    for kind, params in VECTOR_INDEXES:
        ds.create_index("vec", kind, name=f"vec_{kind.lower()}", **params)
    lance.dataset(loc.uri).initialize_mem_wal(unsharded=True)  # Lance core's init: maintain all indexes
    region = str(uuid.uuid4())
    with RegionWriter(loc.uri, region, config=WriterConfig(max_memtable_rows=20, max_flush_interval_s=None)) as w:
        w.put(_typed_rows(range(1000, 1020)))  # reaches the threshold: flushes
        assert w.memtable.is_empty(), "the flush must not keep the rows in memory"
    m = load_latest_manifest(loc.store(), region)
    gen = lance.dataset(loc.store().uri_of(naming.generation_dir(region, m.flushed_generations[0].path)))
    built = {d.name for d in gen.describe_indices()}
    wanted = {f"{c}_{k.lower()}" for c, k in SCALAR_INDEXES} | {f"vec_{k.lower()}" for k, _ in VECTOR_INDEXES}
    assert wanted <= built, f"indexes missing on the generation: {sorted(wanted - built)}"
    assert len(_ids(LsmReader(MemWalTable(loc.uri)).scan())) == 320
    assert len(_ids(lance_core_scan(loc))) == 320


def test_an_index_lance_cannot_build_is_skipped_with_a_warning_and_leaves_no_orphan(local_location, caplog,
                                                                                    monkeypatch):
    """An index the flush cannot build (here: Lance refuses the type) is skipped with a warning naming it; the
    generation is committed, readers answer from it, and no failed-flush directory is left behind."""
    from memwal import generation_indexes

    loc = local_location
    ds = lance.write_dataset(_typed_rows(range(50), "base"), loc.uri)
    ds.create_scalar_index("tags", "LABEL_LIST", name="tag_idx")
    initialize_mem_wal(loc.uri, None, None, maintained_indexes=["tag_idx"])
    monkeypatch.setitem(generation_indexes._CREATE_TYPES, "LABELLIST", "NO_SUCH_TYPE")
    region = str(uuid.uuid4())
    with RegionWriter(loc.uri, region, config=NEVER) as w:
        w.put(_typed_rows(range(100, 105)))
        assert w.flush() is not None
    assert "tag_idx" in caplog.text and "not built" in caplog.text
    assert sorted(_ids(LsmReader(MemWalTable(loc.uri)).scan()))[-5:] == [100, 101, 102, 103, 104]
    m = load_latest_manifest(loc.store(), region)
    dirs = {d for d in loc.store().list_dirs(naming.region_dir(region) + "/") if "_gen_" in d}
    assert dirs == {fg.path for fg in m.flushed_generations}, f"orphan generation directories: {dirs}"


def test_a_failed_flush_removes_its_directory(local_location, monkeypatch):
    """A flush that fails after writing part of its generation (here: the bloom filter's write) removes the
    directory; the MemTable keeps the rows and the next flush commits them."""
    loc = local_location
    region = _not_null_table(loc)
    with RegionWriter(loc.uri, region, config=NEVER) as w:
        w.put(_not_null_rows([5]))
        with _failing_bloom_filter(monkeypatch, "the store refused the bloom filter"), \
                pytest.raises(OSError, match="injected"):
            w.flush()
        assert not [d for d in loc.store().list_dirs(naming.region_dir(region) + "/") if "_gen_" in d]
        assert w.memtable.rows == 1
    assert _ids(LsmReader(MemWalTable(loc.uri)).scan()) == [1, 5]


# -- schema evolution ------------------------------------------------------------------------------------


def _crash_after_put(loc, region, table) -> None:
    w = RegionWriter(loc.uri, region, config=NEVER)
    w.put(table)
    del w  # dies before flushing: the row is only in the WAL


def _base_with_name(loc, ids) -> None:
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("name", pa.string())])
    lance.write_dataset(pa.table({"id": list(ids), "name": [f"b{i}" for i in ids]}, schema=schema), loc.uri)
    initialize_mem_wal(loc.uri, None, None)


def _row(i, name, **more) -> pa.Table:
    return pa.table({"id": pa.array([i], pa.int64()), "name": [name], **{k: [v] for k, v in more.items()}})


def test_a_column_added_while_a_region_has_unflushed_wal(local_location):
    """put(id=10), the writer dies; add_columns n (all nulls, as Lance allows with a MemWAL); a new writer
    replays the entry with n null (as Lance core's replay does), takes puts with n, flushes, and it merges."""
    loc = local_location
    _base_with_name(loc, [1, 2])
    region = str(uuid.uuid4())
    _crash_after_put(loc, region, _row(10, "x"))
    lance.dataset(loc.uri).add_columns({"n": "CAST(NULL AS BIGINT)"})
    with RegionWriter(loc.uri, region, config=NEVER) as w:
        assert w.stats.replayed_entries == 1
        w.put(_row(11, "y", n=pa.scalar(5, pa.int64())))
    got = {r["id"]: r["n"] for r in LsmReader(MemWalTable(loc.uri)).scan().to_pylist()}
    assert got == {1: None, 2: None, 10: None, 11: 5}
    assert not merge_table(MemWalTable(loc.uri)).failed_regions
    assert {r["id"]: r["n"] for r in lance.dataset(loc.uri).to_table().to_pylist()} == got


def test_a_column_added_between_flushes_and_under_a_live_writer(local_location):
    """Generation 1 is flushed without n; n is added to the base while the writer lives; a put naming n is
    taken (the writer re-reads the schema), the MemTable's older rows get n null, and both generations merge."""
    loc = local_location
    _base_with_name(loc, [1])
    region = str(uuid.uuid4())
    with RegionWriter(loc.uri, region, config=NEVER) as w:
        w.put(_row(10, "x"))
        w.flush()
        w.put(_row(11, "y"))
        lance.dataset(loc.uri).add_columns({"n": "CAST(NULL AS BIGINT)"})
        w.put(_row(12, "z", n=pa.scalar(7, pa.int64())))
    expected = {1: None, 10: None, 11: None, 12: 7}
    assert {r["id"]: r["n"] for r in LsmReader(MemWalTable(loc.uri)).scan().to_pylist()} == expected
    assert sorted(lance_core_scan(loc).column("id").to_pylist()) == [1, 10, 11, 12]
    assert not merge_table(MemWalTable(loc.uri)).failed_regions
    assert {r["id"]: r["n"] for r in lance.dataset(loc.uri).to_table().to_pylist()} == expected


def test_a_renamed_column_keeps_the_values_of_unflushed_wal(local_location):
    """Lance matches columns by field id: after alter_columns renames `name` to `label`, Lance core's replay
    keeps the value under the new name. Ours too (WAL entries carry `lance:field_id`)."""
    loc = local_location
    _base_with_name(loc, [1])
    region = str(uuid.uuid4())
    _crash_after_put(loc, region, _row(10, "x"))
    lance.dataset(loc.uri).alter_columns({"path": "name", "name": "label"})
    RegionWriter(loc.uri, region, config=NEVER).close()
    got = {r["id"]: r["label"] for r in LsmReader(MemWalTable(loc.uri)).scan().to_pylist()}
    assert got == {1: "b1", 10: "x"}, "the renamed column must keep the value the WAL holds"


def test_a_dropped_column_leaves_the_region_writable(local_location):
    loc = local_location
    _base_with_name(loc, [1])
    lance.dataset(loc.uri).add_columns({"n": "CAST(NULL AS BIGINT)"})
    region = str(uuid.uuid4())
    _crash_after_put(loc, region, _row(10, "x", n=pa.scalar(3, pa.int64())))
    lance.dataset(loc.uri).drop_columns(["n"])
    with RegionWriter(loc.uri, region, config=NEVER) as w:
        w.put(_row(11, "y"))
    assert sorted(LsmReader(MemWalTable(loc.uri)).scan().column_names) == ["id", "name"]
    assert _ids(LsmReader(MemWalTable(loc.uri)).scan()) == [1, 10, 11]


def test_a_put_with_a_column_the_table_does_not_have_is_refused(local_location):
    """Dropping an unknown column silently would lose what the caller wrote."""
    loc = local_location
    _base_with_name(loc, [1])
    with RegionWriter(loc.uri, str(uuid.uuid4()), config=NEVER) as w:
        with pytest.raises(ValueError, match=r"\['color'\] are not in the base table"):
            w.put(_row(5, "x", color="red"))
        assert w.stats.wal_entries == 0


# -- the maintained set changing under a live writer -----------------------------------------------------


def test_a_live_writer_builds_an_index_added_to_the_maintained_set(local_location):
    """The writer starts maintaining nothing; an INVERTED index is created on the base and added to the
    maintained set; the writer's next flush builds it on the generation (it re-reads the set when the base
    moved), so Lance core's and LanceDB's planners can search the generation."""
    from dataclasses import replace

    loc = local_location
    ds = lance.write_dataset(_typed_rows(range(20), "base"), loc.uri)
    initialize_mem_wal(loc.uri, None, None, maintained_indexes=[])
    region = str(uuid.uuid4())
    with RegionWriter(loc.uri, region, config=NEVER) as w:
        w.put(_typed_rows([100]))
        ds = lance.dataset(loc.uri)
        ds.create_scalar_index("txt", "INVERTED", name="txt_idx")
        MemWalTable(loc.uri).commit_details(lambda d: replace(d, maintained_indexes=("txt_idx",),
                                                              maintain_all_indexes=False))
        w.flush()
    m = load_latest_manifest(loc.store(), region)
    gen = lance.dataset(loc.store().uri_of(naming.generation_dir(region, m.flushed_generations[0].path)))
    assert "txt_idx" in {d.name for d in gen.describe_indices()}, "the new maintained index must be built"


# -- composite keys --------------------------------------------------------------------------------------


def _composite_schema() -> pa.Schema:
    def key(position):
        return {**PK, "lance-schema:unenforced-primary-key:position": str(position)}
    return pa.schema([pa.field("a", pa.int32(), nullable=False, metadata=key(1)),
                      pa.field("b", pa.string(), nullable=False, metadata=key(2)),
                      pa.field("v", pa.string())])


def _composite_rows(keys, tag="v") -> pa.Table:
    return pa.table({"a": pa.array([k[0] for k in keys], pa.int32()), "b": [k[1] for k in keys],
                     "v": [f"{tag}{k[0]}{k[1]}" for k in keys]}, schema=_composite_schema())


def _pk_index_values(loc, region) -> list[bytes]:
    from lance.file import LanceFileReader

    m = load_latest_manifest(loc.store(), region)
    path = loc.store().uri_of(f"{naming.generation_dir(region, m.flushed_generations[-1].path)}/"
                              f"{naming.PK_INDEX_DIR}/page_data.lance")
    return LanceFileReader(path).read_all().to_table().column("values").to_pylist()


def test_a_composite_key_generation_gets_lance_cores_pk_index(tmp_path):
    """Lance core writes `_pk_index/` for a composite key too (a BTREE over an order-preserving binary
    encoding); its LsmScanner refuses a generation without one. The same rows flushed by Lance core's writer
    and by ours give the same index values, and Lance core's scanner reads our generation newest-wins."""
    from support.tables import lance_core_snapshots  # noqa: F401 - the oracle lance_core_scan uses

    keys = [(1, "x"), (-1, "a\x00b"), (2, ""), (300, "ab\xff")]
    values = {}
    for who in ("lance_core", "ours"):
        loc = _Loc(str(tmp_path / who))
        lance.write_dataset(_composite_rows([(9, "base")], "base"), loc.uri)
        lance.dataset(loc.uri).initialize_mem_wal(unsharded=True)
        region = str(uuid.uuid4())
        if who == "lance_core":
            with lance.dataset(loc.uri).mem_wal_writer(region) as w:
                w.put(_composite_rows(keys))
        else:
            with RegionWriter(loc.uri, region, config=NEVER) as w:
                w.put(_composite_rows(keys))
                w.put(_composite_rows([(1, "x")], "new"))
                w.delete(pa.table({"a": pa.array([2], pa.int32()), "b": [""]}))
        values[who] = sorted(_pk_index_values(loc, region))
        if who == "ours":
            got = {(r["a"], r["b"]): r["v"] for r in lance_core_scan(loc).to_pylist()}
            assert got == {(9, "base"): "base9base", (1, "x"): "new1x", (-1, "a\x00b"): "v-1a\x00b",
                           (300, "ab\xff"): "v300ab\xff"}
    assert set(values["lance_core"]) <= set(values["ours"]), "our composite key bytes must be Lance core's"


class _Loc:
    """A local table location (what the `local_location` fixture gives) for a second table in one test."""

    def __init__(self, uri: str):
        self.uri, self.storage_options = uri, None

    def store(self):
        from memwal.storage import ObjectStore
        return ObjectStore(self.uri)


# -- a region that cannot flush says why ------------------------------------------------------------------


def test_a_region_that_cannot_flush_says_why_in_status_alerts_and_the_page(local_location, monkeypatch):
    """A flush that keeps failing leaves the rows in the MemTable and WAL and records why: `memwal status`
    gives the region's flush_failure (error, attempts, rows held), the lag check raises a `flush_failing`
    breach, the page's row shows it, and the next flush that commits clears it."""
    from memwal.airflow.ui.regions import region_rows
    from memwal.lag import breaches
    from memwal.status import table_status

    loc = local_location
    region = _not_null_table(loc)
    with RegionWriter(loc.uri, region, config=NEVER) as w:
        w.put(_not_null_rows([5, 6]))
        with _failing_bloom_filter(monkeypatch, "index build exploded"):
            for _ in range(2):
                with pytest.raises(OSError):
                    w.flush()
        summary = table_status(MemWalTable(loc.uri)).to_dict()
        failure = summary["regions"][0]["flush_failure"]
        assert "cannot flush generation 1" in failure and "2 attempts" in failure and "2 rows held" in failure
        assert "injected: index build exploded" in failure
        found = [b for b in breaches(summary, {}) if b["metric"] == "flush_failing"]
        assert len(found) == 1 and "injected" in found[0]["message"] and region in found[0]["message"]
        assert "injected" in region_rows(summary, {}, None)[0]["error"]
        assert w.flush() is not None
    assert table_status(MemWalTable(loc.uri)).to_dict()["regions"][0]["flush_failure"] is None
    assert not loc.store().exists(naming.flush_failure_path(region))


def test_lancedb_reads_deletes_our_writer_flushes_into_a_lancemodel_table(local_location):
    """A LanceDB table from a LanceModel (every non-Optional field NOT NULL), its key marked and an unsharded
    LSM write spec; LanceDB writes a generation; our writer then deletes a base key and upserts into the same
    shard and flushes: LanceDB's LSM read sees exactly the newest rows (the delete included), and so do ours
    and Lance core's."""
    import asyncio

    import lancedb
    from lancedb import LsmWriteSpec
    from lancedb.pydantic import LanceModel

    class Item(LanceModel):
        id: int
        grp: int
        val: str

    loc = local_location.child("db")

    def rows_of(ids, tag):
        return pa.table({"id": list(ids), "grp": [i % 3 for i in ids], "val": [f"{tag}{i}" for i in ids]},
                        schema=Item.to_arrow_schema())

    async def create():
        db = await lancedb.connect_async(loc.uri)
        t = await db.create_table("t", schema=Item)
        await t.add(rows_of(range(5), "base"))
        await t.set_unenforced_primary_key("id")
        await t.set_lsm_write_spec(LsmWriteSpec.unsharded())
        await (t.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
               .execute(rows_of([1, 10], "lancedb")))
        await t.close_lsm_writers()

    async def query():
        db = await lancedb.connect_async(loc.uri)
        return (await (await db.open_table("t")).query().to_arrow()).to_pylist()

    asyncio.run(create())
    table = loc.child("t.lance")
    schema = lance.dataset(table.uri).schema
    assert not schema.field("val").nullable, "LanceModel makes a non-Optional field NOT NULL"
    [shard] = {d for d in table.store().list_dirs(f"{naming.MEM_WAL_DIR}/")} - {"_staging"}
    with RegionWriter(table.uri, shard, config=NEVER) as w:
        w.delete(pa.table({"id": pa.array([2], pa.int64())}))
        w.put(rows_of([3, 11], "ours"))
    expected = {0: "base0", 1: "lancedb1", 3: "ours3", 4: "base4", 10: "lancedb10", 11: "ours11"}
    assert {r["id"]: r["val"] for r in asyncio.run(query())} == expected, "LanceDB's LSM read"
    assert {r["id"]: r["val"] for r in LsmReader(MemWalTable(table.uri)).scan().to_pylist()} == expected
    assert {r["id"]: r["val"] for r in lance_core_scan(table).to_pylist()} == expected


def test_searches_and_filters_over_a_generation_flushed_before_a_column_was_added(local_location):
    """A generation flushed before `n` was added reads `n` as null (as Lance core's scanner does): a scan,
    a filter on `n`, a vector search and a full-text search over it answer as over one schema."""
    loc = local_location
    ds = lance.write_dataset(_typed_rows(range(40), "base"), loc.uri)
    ds.create_index("vec", "IVF_FLAT", name="vec_idx", num_partitions=2)
    ds.create_scalar_index("txt", "INVERTED", name="txt_idx")
    initialize_mem_wal(loc.uri, None, None, maintained_indexes=["vec_idx", "txt_idx"])
    region = str(uuid.uuid4())
    with RegionWriter(loc.uri, region, config=NEVER) as w:
        w.put(_typed_rows([100, 101], "gen"))
        w.flush()
        lance.dataset(loc.uri).add_columns({"n": "CAST(NULL AS BIGINT)"})
        w.put(_typed_rows([102]).append_column("n", pa.array([3], pa.int64())))
    reader = LsmReader(MemWalTable(loc.uri))
    assert _ids(reader.scan(filter="n IS NULL")) == [*range(40), 100, 101]
    assert _ids(reader.scan(filter="n = 3")) == [102]
    target = _typed_rows([101]).column("vec")[0].values.to_numpy()
    hit = reader.search(target, k=1, columns=["id", "n"]).to_pylist()[0]
    assert hit["id"] in (101, *[i for i in range(40) if i % 11 == 101 % 11]) and hit["n"] is None
    found = reader.full_text_search("gen", k=10, columns=["id", "n"])
    assert _ids(found) == [100, 101] and found.column("n").null_count == 2


def test_a_live_memtable_from_before_a_column_was_added_reads_it_as_null(local_location):
    """A strong read with the MemTable of a writer that has not seen `n` added (no flush, no put naming it
    since): the MemTable's rows read `n` as null, as a generation's would (the model machine found it: write,
    add_column, read)."""
    loc = local_location
    _base_with_name(loc, [1])
    with RegionWriter(loc.uri, str(uuid.uuid4()), config=NEVER) as w:
        w.put(_row(10, "x"))
        lance.dataset(loc.uri).add_columns({"n": "CAST(NULL AS BIGINT)"})
        memtables = [(w.region_id, w.memtable.generation, w.memtable_table())]
        got = LsmReader(MemWalTable(loc.uri), memtables=memtables).scan(columns=["id", "n"]).to_pylist()
    assert sorted(got, key=lambda r: r["id"]) == [{"id": 1, "n": None}, {"id": 10, "n": None}]
