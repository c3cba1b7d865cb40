"""LsmReader: a reader reads one version of the table for its whole life, whatever later happens to the handle
it was built from (a refresh, a job's commit on that handle)."""

from __future__ import annotations

import uuid

import lance
import pyarrow as pa
import pytest

from memwal.errors import BadInputError
from memwal.merge import merge_table
from memwal.reader import LsmReader
from memwal.table import MemWalTable

from support.maintenance import flush_generation
from support.tables import SCHEMA


def _table(names: dict[int, str]) -> pa.Table:
    ids = sorted(names)
    return pa.table({"id": ids, "name": [names[i] for i in ids], "score": [0.0] * len(ids)}, schema=SCHEMA)


def test_a_reader_built_from_a_handle_keeps_its_version_when_a_job_moves_the_handle(local_location):
    """Base ids 0-99 ('apple' in the even ones) with an INVERTED index; three generations of one region
    rewrite, delete and add 'apple' rows. A reader built from the handle, then merge_table on that handle:
    the merge changes no row of the reader's view, so its searches and scan answer as before, at its version."""
    loc = local_location
    ds = lance.write_dataset(_table({i: "apple" if i % 2 == 0 else "pear" for i in range(100)}), loc.uri)
    ds.create_scalar_index("name", "INVERTED", name="name_idx")
    lance.dataset(loc.uri).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    flush_generation(loc, region, _table({i: "pear" for i in range(0, 20, 2)}))  # 10 apples lost
    flush_generation(loc, region, None, deletes=range(20, 40, 2))  # 10 more
    flush_generation(loc, region, _table({i: "apple" for i in range(200, 215)}))  # 15 new
    handle = MemWalTable.open(loc.uri)
    reader = LsmReader(handle)
    version = reader.base.version
    want = sorted([*range(40, 100, 2), *range(200, 215)])
    assert sorted(reader.full_text_search("apple", k=1000).column("id").to_pylist()) == want
    assert merge_table(handle).regions[0].merged_generation_after == 3
    assert handle.version > version, "the merge committed through the handle"
    assert reader.base.version == version, "the reader's base moved with the handle"
    assert sorted(reader.full_text_search("apple", k=1000).column("id").to_pylist()) == want
    assert sorted(reader.scan(columns=["id"], filter="name = 'apple'").column("id").to_pylist()) == want


def test_get_of_a_null_key_is_refused_naming_the_table(local_location):
    lance.write_dataset(_table({1: "a"}), local_location.uri)
    with pytest.raises(BadInputError, match=r"/table: get of a null primary key None"):
        LsmReader(local_location.uri).get(None)
