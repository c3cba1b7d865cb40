"""LanceDB 0.40 as a peer: tables it makes and writes through its LSM path (key marked by position only),
merged, caught up, snapshotted and collected by our jobs, locally and on S3 (moto), while LanceDB's own
query() and count_rows() equal a model after every round and LanceDB goes on writing to the same table."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from memwal.cli import main
from memwal.mem_wal_index import initialize_mem_wal, load_index
from memwal.region_manifest import list_regions, load_latest_manifest
from memwal.region_spec import RegionField, RegionSpec
from memwal.status import table_status
from memwal.storage import ObjectStore
from memwal.table import MemWalTable
from memwal.table_writer import TableWriter, lancedb_shard_id, region_id_for, writer_region_id
from memwal.transforms import route
from memwal.writer import RegionWriter, WriterConfig

from support.lancedb_peer import (
    FTS_INDEX,
    INDEX,
    VECTOR_INDEX,
    LanceDbTable,
    deletion_files,
    generation_dirs,
    merge_and_maintain,
    round_batches,
    rows,
)
from support.tables import create_base
from support.tables import rows as base_rows
from support.vector_model import ANN_K, QUERIES, WORDS, assert_top_k, exact_order, fts_ids

NEVER = WriterConfig(max_memtable_rows=10**9, max_flush_interval_s=None)


# Every spec locally; on S3 (the same code paths over another store, and slower) the bucket spec with
# its maintained index.
@pytest.mark.parametrize(("where", "spec", "indexed"), [
    ("local", "bucket", True), ("local", "identity", False), ("local", "unsharded", False), ("s3", "bucket", True),
])
def test_lancedb_lsm_rounds_merged_by_memwal_and_lancedb_writes_on(request, where, spec, indexed):
    """Three rounds (two on S3) of LanceDB LSM writes (each with keys written twice in one generation), each merged,
    caught up, snapshotted and collected; LanceDB reads the model before and after, and writes on."""
    t = LanceDbTable(request.getfixturevalue(f"{where}_location"))
    t.create(spec, maintained_index=indexed)
    collected = 0
    for r in range(3 if where == "local" else 2):
        before = generation_dirs(t)
        batches = round_batches(r)
        t.write_round(batches)
        assert t.query() == t.expected(), f"round {r}: LanceDB's LSM read must equal the model before merging"
        assert deletion_files(t), "a key written twice in one generation is masked by a deletion file"
        assert len(generation_dirs(t) - before) == len(t.flushed_max()), "one new generation per shard"
        status = table_status(MemWalTable(t.table.uri, t.table.storage_options)).to_dict()
        assert {r["region_id"]: r["unmerged_generations"] for r in status["regions"]} == \
            {shard: 1 for shard in t.flushed_max()}, "memwal status shows each shard's new generation"
        assert status["unmerged_rows"] == len({i for b in batches for i in b.column("id").to_pylist()}), \
            "unmerged rows count live rows (not the rows LanceDB masked with a deletion file)"
        jobs = merge_and_maintain(t)
        assert t.query() == t.expected(), f"round {r}: LanceDB's read after the merge must equal the model"
        assert t.count_rows() == len(t.model), "LanceDB's count_rows (base table only) counts every key"
        if indexed:
            [index] = [i for i in jobs["catchup"]["indexes"] if i["index_name"] == INDEX]
            assert index["covered"], f"{INDEX} covers the merged rows after catch-up: {index}"
            assert t.query(f"val = 'r{r}b-{r}'") == [t.model[r]], "LanceDB's indexed filter finds the row"
        collected += jobs["gc"]["deleted"].get("generation", 0)
        listed = {fg.path for m in manifests(t).values() for fg in m.flushed_generations}
        assert generation_dirs(t) <= listed, "GC leaves no part of a collected generation (_deletions/, _indices/)"
    assert collected >= len(t.flushed_max()), "GC collected merged generations, LanceDB's included"
    assert all(m.writer_epoch >= 2 for m in manifests(t).values()), "LanceDB re-claimed its shards each round"


def test_lancedb_vector_and_fts_search_after_our_maintenance(local_location):
    """LanceDB makes a table with IVF_PQ, FTS and BTREE indexes, all maintained through its LSM path, and
    writes three rounds; after each, our jobs merge, catch up, compact, retain, snapshot and collect. Then
    LanceDB's exact and ANN (every partition probed, refined over every row) vector searches and its FTS on
    the base table equal the brute-force model (tests/support/vector_model.py), index_stats shows no unindexed row,
    and LanceDB's LSM read equals the model; LanceDB writes on after our compaction."""
    t = LanceDbTable(local_location)
    t.create("bucket", vector=True)
    for r in range(3):
        t.write_round(round_batches(r, vector=True))
        assert t.query() == t.expected(), f"round {r}: LanceDB's LSM read before the merge"
        jobs = merge_and_maintain(t, compact=True)
        assert {i["index_name"]: i["covered"] for i in jobs["catchup"]["indexes"]} == \
            {INDEX: True, VECTOR_INDEX: True, FTS_INDEX: True}, jobs["catchup"]
        names = {k: m["val"] for k, m in t.model.items()}
        for qi, q in enumerate(QUERIES):
            assert sorted(t.nearest_base(q, len(names), exact=True)) == exact_order(names, q), \
                f"round {r}: LanceDB's exact search, query {qi}"
            ann = t.nearest_base(q, ANN_K, exact=False, refine_factor=math.ceil(len(names) / ANN_K) + 1)
            assert_top_k(ann, names, q, ANN_K, f"round {r}: LanceDB's ANN search, query {qi}")
        for word in WORDS:
            assert t.fts_base(word) == fts_ids(names, word), f"round {r}: LanceDB's FTS {word!r}"
        ann_plan, fts_plan = t.search_plans(QUERIES[0], WORDS[0])
        assert f"ANNSubIndex: name={VECTOR_INDEX}" in ann_plan, ann_plan
        assert "MatchQuery: column=text" in fts_plan and "FlatMatchQuery" not in fts_plan, fts_plan
        for index in (INDEX, VECTOR_INDEX, FTS_INDEX):
            stats = t.index_stats(index)
            assert stats.num_unindexed_rows == 0 and stats.num_indexed_rows == len(names), (r, index, stats)
        assert t.query() == t.expected() and t.count_rows() == len(names)
        assert t.query(f"val = 'r{r}b-{r}'") == [t.model[r]], "LanceDB's indexed filter finds the row"


def manifests(t: LanceDbTable) -> dict:
    return {r: load_latest_manifest(t.table.store(), r) for r in t.flushed_max()}


def test_lancedb_reads_what_our_writer_flushes_into_its_table(location):
    """LanceDB writes keys of one bucket (one shard); our RegionWriter then flushes into that shard (a key
    updated, a new key, a base key deleted); LanceDB's query sees our generation; LanceDB writes on (its
    newer rows win), and the merge of both writers' generations equals the model."""
    t = LanceDbTable(location)
    t.create("bucket")
    [bucket] = t.shard_groups(rows([7], "x"))
    same = [i for i in [*range(20), *range(1000, 1100)] if list(t.shard_groups(rows([i], "x"))) == [bucket]]
    base_key, new_keys = same[0] if same[0] != 7 else same[1], [i for i in same if i >= 1000][:3]
    t.write_round([rows([7, *new_keys[:2]], "lancedb")])
    [shard] = t.flushed_max()

    ours = rows([7, new_keys[2]], "ours")
    with RegionWriter(t.table.uri, shard, storage_options=t.table.storage_options, config=NEVER) as w:
        w.put(ours)
        w.delete(rows([base_key], "gone").select(["id"]))
    t._note(ours)
    del t.model[base_key]
    assert t.query() == t.expected(), "LanceDB's LSM read must see the generation our writer flushed"

    t.write_round([rows([7, new_keys[2]], "lancedb-again")])
    assert t.query() == t.expected(), "LanceDB writes on after our writer; its newer rows win"
    merge_and_maintain(t)
    assert t.query() == t.expected() and t.count_rows() == len(t.model)


@pytest.mark.parametrize("spec", ["bucket", "identity", "unsharded"])
def test_our_table_writer_writes_into_lancedbs_shards(local_location, spec):
    """LanceDB writes a round; our TableWriter then updates some of those keys and adds others: it must
    write into LanceDB's shards (no second region for the same bucket, where a key would live twice and
    which version wins would depend on region order); LanceDB reads our rows, writes on, and the merge
    equals the model."""
    t = LanceDbTable(local_location)
    t.create(spec)
    t.write_round(round_batches(0))
    shards = set(t.flushed_max())
    ours = rows([*range(100, 106), *range(500, 506)], "ours")
    with TableWriter(t.table.uri, config=NEVER) as w:
        w.put(ours)
    t._note(ours)
    assert set(w.writers) <= shards, f"our writer opened regions LanceDB does not use: {set(w.writers) - shards}"
    assert t.query() == t.expected(), "LanceDB's LSM read sees what our TableWriter flushed"
    t.write_round([rows(range(100, 103), "lancedb-again")])
    assert t.query() == t.expected(), "LanceDB's newer rows win over ours"
    merge_and_maintain(t)
    assert t.query() == t.expected() and t.count_rows() == len(t.model)


@pytest.mark.parametrize(("typ", "values"), [(pa.string(), ["a", "bc"]), (pa.int32(), [1, -2])])
def test_lancedb_shard_ids_of_identity_values(tmp_path, typ, values):
    """LanceDB names an identity shard by the value's bytes (UTF-8, little-endian at the integer's width)."""
    import asyncio

    import lancedb
    from lancedb import LsmWriteSpec

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("g", typ)])

    async def write(db_dir):
        db = await lancedb.connect_async(db_dir)
        t = await db.create_table("t", pa.table({"id": [0], "g": pa.array(values[:1], typ)}, schema=schema))
        await t.set_unenforced_primary_key("id")
        await t.set_lsm_write_spec(LsmWriteSpec.identity("g"))
        for i, v in enumerate(values):
            h = await db.open_table("t")
            await (h.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
                   .execute(pa.table({"id": [i + 1], "g": pa.array([v], typ)}, schema=schema)))
            await h.close_lsm_writers()

    asyncio.run(write(str(tmp_path)))
    details = load_index(str(tmp_path / "t.lance"), None).details
    spec = details.region_spec(details.newest_region_spec_id)
    assert set(list_regions(ObjectStore(str(tmp_path / "t.lance")))) == {
        lancedb_shard_id(spec, [v]) for v in values}


def test_a_table_with_regions_of_the_older_form_keeps_them(local_location):
    """A region our writer made before it used LanceDB's shard ids (region_id_for) keeps its keys: the
    TableWriter writes there, not into a second region of the same bucket."""
    create_base(local_location, ids=range(4))
    spec = RegionSpec(1, (RegionField("b", (0,), "bucket", None, "int32", {"num_buckets": "2"}),))
    initialize_mem_wal(local_location.uri, None, spec)
    [(bucket, _)] = route(spec, base_rows([7], "x"), {0: "id"}).items()
    older = region_id_for(1, bucket)
    with RegionWriter(local_location.uri, older, config=NEVER) as w:
        w.put(base_rows([7], "old"))
    with TableWriter(local_location.uri, config=NEVER) as tw:
        tw.put(base_rows([7, 8, 9], "new"))
    assert older in tw.writers, "key 7's bucket still goes to the region that already holds key 7"
    assert writer_region_id(spec, bucket) != older


def test_memwal_merge_command_on_the_issue_table(local_location, capsys):
    """The reported case: LanceDB's bucket("id", 4) table, one round, then `memwal merge TABLE` (it used to
    fail every region with "has no primary key")."""
    t = LanceDbTable(local_location)
    t.create("bucket")
    t.write_round(round_batches(0))
    assert main(["merge", t.table.uri, "--json"]) == 0, capsys.readouterr()
    assert t.count_rows() == len(t.model) and t.query() == t.expected()
