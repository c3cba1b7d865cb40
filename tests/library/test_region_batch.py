"""One region batch deduplicated and staged by a worker, and turned back into a MergeInput on the driver
(memwal.region_batch, memwal.staged_files): the Spark dedup's executor code, run here without Spark."""

from __future__ import annotations

import uuid

import pyarrow as pa

from memwal import naming
from memwal.errors import MemWalError
from memwal.merge import local_dedup, pending_generations
from memwal.region_batch import StagedBatch, batch_input, stage_region_batch
from memwal.staged_files import RoundStaging, StagedFiles, unit_prefix
from memwal.table import MemWalTable

from support.maintenance import write_generations
from support.tables import create_base, open_base


def _batch(loc):
    """Base ids 0..9; region r: gen 1 puts 1, 2, 3; gen 2 puts 2 again and deletes 3 and 9."""
    create_base(loc, ids=range(10))
    open_base(loc).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    write_generations(loc, region, [([1, 2, 3], "g1", []), ([2], "g2", [3, 9])])
    table = MemWalTable.open(loc.uri)
    return table, pending_generations(table, region, 0)


def _as_dict(t: pa.Table) -> dict:
    return {r["id"]: r["name"] for r in t.sort_by("id").to_pylist()}


def test_a_staged_batch_gives_what_the_in_process_dedup_gives(local_location):
    """Staged in files of one row each: upserts {1: g11, 2: g22} (name: tag + id), deleted keys {3, 9}:
    what local_dedup gives."""
    table, refs = _batch(local_location)
    schema, pk, store = table.schema, table.primary_key, table.store
    prefix = f"{naming.STAGING_DIR}/merge-test"
    done = stage_region_batch(store, refs, pk, schema, prefix=unit_prefix(prefix, 0), tag="t", inline=False,
                              file_bytes=1, batch_rows=1)
    assert not done.inline and len(done.files) == 2 and done.upserts == 2 and done.deleted == 2
    staging = RoundStaging(store, prefix, 1)
    data = batch_input(store, refs, done, schema, pk, staging, 0)
    expected = local_dedup(refs, pk, schema, store)
    assert _as_dict(data.open_upserts()) == _as_dict(expected.open_upserts()) == {1: "g11", 2: "g22"}
    assert sorted(data.open_deleted(store).column("id").to_pylist()) == [3, 9], "deleted keys read from files"
    assert data.rows_read == expected.rows_read == 6, "3 + 1 puts and 2 tombstones"
    region = refs[0].region_id
    assert data.winners == expected.winners == {region: (1, 2)}, (
        "the lowest generation of a winning upsert (1 in gen 1) and of a winning tombstone (3, 9 in gen 2)")
    data.cleanup()
    assert not list(store.list(prefix)), "the last unit's cleanup deletes the job's staging prefix"


def test_an_inline_batch_stages_nothing(local_location):
    table, refs = _batch(local_location)
    store = table.store
    done = stage_region_batch(store, refs, table.primary_key, table.schema, prefix="_mem_wal/_staging/x",
                              tag="t", inline=True, file_bytes=1 << 20, batch_rows=100)
    assert done.inline and done.files == [] and done.deleted_files == []
    data = batch_input(store, refs, done, table.schema, table.primary_key, RoundStaging(store, "x", 1), 0)
    assert _as_dict(data.open_upserts()) == {1: "g11", 2: "g22"} and data.staged == ()
    assert sorted(data.deleted_keys.column("id").to_pylist()) == [3, 9]
    assert data.winners == {refs[0].region_id: (1, 2)}


def test_staged_files_that_do_not_add_up_fail_the_batch(local_location):
    """The worker counted 2 upserts, the files hold 1: the batch fails (its region only) and its files go."""
    table, refs = _batch(local_location)
    store = table.store
    files = StagedFiles(store, "_mem_wal/_staging/y/u00000", table.schema, 1 << 20, "t")
    files.write(table.schema.empty_table())
    assert files.written == [], "an empty table writes no file"
    bad = StagedBatch(upserts=2, files=[("_mem_wal/_staging/y/u00000/part-a.arrow", 1)])
    staging = RoundStaging(store, "_mem_wal/_staging/y", 2)
    got = batch_input(store, refs, bad, table.schema, table.primary_key, staging, 0)
    assert isinstance(got, MemWalError) and "staged 1 of 2 rows" in str(got)
    failed = batch_input(store, refs, "boom", table.schema, table.primary_key, RoundStaging(store, "z", 1), 0)
    assert isinstance(failed, MemWalError) and "failed: boom" in str(failed)
