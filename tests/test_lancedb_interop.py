"""LanceDB 0.40 as a peer: tables it makes and writes through its LSM path (key marked by position only),
merged, caught up, snapshotted and collected by our jobs, locally and on S3 (moto), while LanceDB's own
query() and count_rows() equal a model after every round and LanceDB goes on writing to the same table."""

from __future__ import annotations

import pytest
from lancedb_peer import INDEX, LanceDbTable, deletion_files, generation_dirs, merge_and_maintain, round_batches, rows

from memwal.region_manifest import load_latest_manifest
from memwal.writer import RegionWriter, WriterConfig


@pytest.mark.parametrize(("spec", "indexed"), [("bucket", True), ("identity", False), ("unsharded", False)])
def test_lancedb_lsm_rounds_merged_by_memwal_and_lancedb_writes_on(location, spec, indexed):
    """Three rounds of LanceDB LSM writes (each with keys written twice in one generation), each merged,
    caught up, snapshotted and collected; LanceDB reads the model before and after, and writes on."""
    t = LanceDbTable(location)
    t.create(spec, maintained_index=indexed)
    collected = 0
    for r in range(3):
        before = generation_dirs(t)
        t.write_round(round_batches(r))
        assert t.query() == t.expected(), f"round {r}: LanceDB's LSM read must equal the model before merging"
        assert deletion_files(t), "a key written twice in one generation is masked by a deletion file"
        assert len(generation_dirs(t) - before) == len(t.flushed_max()), "one new generation per shard"
        jobs = merge_and_maintain(t)
        assert t.query() == t.expected(), f"round {r}: LanceDB's read after the merge must equal the model"
        assert t.count_rows() == len(t.model), "LanceDB's count_rows (base table only) counts every key"
        if indexed:
            [index] = [i for i in jobs["catchup"]["indexes"] if i["index_name"] == INDEX]
            assert index["covered"], f"{INDEX} covers the merged rows after catch-up: {index}"
            assert t.query(f"val = 'r{r}b-{r}'") == [t.model[r]], "LanceDB's indexed filter finds the row"
        collected += jobs["gc"]["deleted"].get("generation", 0)
    assert collected >= len(t.flushed_max()), "GC collected merged generations, LanceDB's included"
    manifests = {r: load_latest_manifest(t.table.store(), r) for r in t.flushed_max()}
    assert all(m.writer_epoch >= 2 for m in manifests.values()), "LanceDB re-claimed its shards each round"


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
    config = WriterConfig(max_memtable_rows=10**9, max_flush_interval_s=None)
    with RegionWriter(t.table.uri, shard, storage_options=t.table.storage_options, config=config) as w:
        w.put(ours)
        w.delete(rows([base_key], "gone").select(["id"]))
    t._note(ours)
    del t.model[base_key]
    assert t.query() == t.expected(), "LanceDB's LSM read must see the generation our writer flushed"

    t.write_round([*round_batches(0), rows([7, new_keys[2]], "lancedb-again")])
    assert t.query() == t.expected(), "LanceDB writes on after our writer; its newer rows win"
    merge_and_maintain(t)
    assert t.query() == t.expected() and t.count_rows() == len(t.model)
