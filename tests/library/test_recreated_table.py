"""A table removed and recreated at the same URI, reaching the same version number with other rows, is read
as itself by every cache that outlives a reader: the search caches (the base's keys, each source's terms:
memwal.newest_version, memwal.full_text_search), a handle's MemWAL index (status, the reader's merged
generations: memwal.table) and the merge's fragment apply (tests/library/test_merge_apply_cache.py)."""

from __future__ import annotations

import shutil
import uuid

import lance
import pyarrow as pa

from memwal.merge import merge_table
from memwal.reader import LsmReader
from memwal.status import table_status
from memwal.storage import lance_storage_options
from memwal.table import MemWalTable

from support.maintenance import flush_generation
from support.tables import SCHEMA


def _table(names: dict[int, str]) -> pa.Table:
    ids = sorted(names)
    return pa.table({"id": ids, "name": [names[i] for i in ids], "score": [0.0] * len(ids)}, schema=SCHEMA)


def _create(loc, names: dict[int, str]) -> int:
    """Base of `names` with an INVERTED index on `name`, MemWAL initialized: version 3, whatever the rows."""
    opts = lance_storage_options(loc.storage_options)
    ds = lance.write_dataset(_table(names), loc.uri, storage_options=opts)
    ds.create_scalar_index("name", "INVERTED", name="name_idx")
    ds = lance.dataset(loc.uri, storage_options=opts)
    ds.initialize_mem_wal(unsharded=True)
    return lance.dataset(loc.uri, storage_options=opts).version


def _recreate(loc, names: dict[int, str]) -> int:
    shutil.rmtree(loc.uri)
    return _create(loc, names)


def _ids(t: pa.Table) -> list[int]:
    return sorted(t.column("id").to_pylist())


def test_full_text_search_reads_the_terms_of_the_recreated_table(local_location):
    """The same keys at the same version; only the texts differ: 'apple' in none of the first table's rows,
    in ten of the second's."""
    loc = local_location
    first = _create(loc, {i: f"banana {i}" for i in range(20)})
    assert LsmReader(loc.uri).full_text_search("apple", k=100).num_rows == 0
    second = _recreate(loc, {i: ("apple" if i < 10 else "banana") + f" {i}" for i in range(20)})
    assert first == second
    assert _ids(LsmReader(loc.uri).full_text_search("apple", k=100)) == list(range(10))


def test_full_text_search_checks_newest_versions_against_the_recreated_tables_keys(local_location):
    """The same texts at the same addresses and version; the second table's keys are 100-119 and a generation
    rewrites 105 without 'apple': the base's 105 is stale and must not match."""
    loc = local_location
    first = _create(loc, {i: "apple" for i in range(20)})
    assert LsmReader(loc.uri).full_text_search("apple", k=100).num_rows == 20
    second = _recreate(loc, {100 + i: "apple" for i in range(20)})
    assert first == second
    flush_generation(loc, str(uuid.uuid4()), _table({105: "cherry"}))
    got = LsmReader(loc.uri).full_text_search("apple", k=100)
    assert _ids(got) == [i for i in range(100, 120) if i != 105], "a stale base row matched"


def test_a_handle_reads_the_recreated_tables_memwal_index(local_location):
    """A handle opened on the first table (region R's generation 1 merged at version 3) and refreshed after the
    table was recreated at version 3 with R's generation 1 flushed but not merged: status and the reader see
    the second table's index (merged generation 0), not the first's."""
    loc = local_location
    region = str(uuid.uuid4())
    opts = lance_storage_options(loc.storage_options)
    lance.write_dataset(_table({i: "a" for i in range(5)}), loc.uri, storage_options=opts)
    lance.dataset(loc.uri, storage_options=opts).initialize_mem_wal(unsharded=True)
    flush_generation(loc, region, _table({1: "one"}))
    merge_table(loc.uri)
    handle = MemWalTable.open(loc.uri)
    first = handle.version
    assert [r.merged_generation for r in table_status(handle).regions] == [1]

    shutil.rmtree(loc.uri)
    lance.write_dataset(_table({i: "b" for i in range(5)}), loc.uri, storage_options=opts)
    lance.write_dataset(_table({7: "b"}), loc.uri, mode="append", storage_options=opts)
    lance.dataset(loc.uri, storage_options=opts).initialize_mem_wal(unsharded=True)
    flush_generation(loc, region, _table({1: "two"}))
    assert handle.refresh().version == first
    status = table_status(handle)
    assert [(r.merged_generation, r.unmerged_generations) for r in status.regions] == [(0, 1)], \
        "status reported the removed table's merge progress"
    assert LsmReader(handle).get(1, columns=["name"]) == {"name": "two"}, "the reader skipped an unmerged generation"
