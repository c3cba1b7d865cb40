"""MemWalTable: opened once, refreshed in place, pickled down to what an executor needs."""

from __future__ import annotations

import pickle

from memwal.table import MemWalTable

from support.maintenance import build_table, merge_region
from support.open_counts import count_opens


def test_refresh_reloads_the_index_only_when_the_version_moved(local_location):
    (region,) = build_table(local_location, regions=1, generations=2)
    table = MemWalTable.open(local_location.uri)
    before = table.index
    assert table.refresh().index is before, "same version: the index already loaded is kept"
    merge_region(local_location.uri, None, region)  # another merger (its own handle)
    with count_opens(local_location.uri) as counts:
        after = table.refresh().index
    assert after.table_version > before.table_version and after.merged_generations == {region: 2}
    assert dict(counts) == {"index": 1}, "a refresh is no new open: one index load for the version that moved"


def test_checkout_leaves_the_handle_where_it_is(local_location):
    (region,) = build_table(local_location, regions=1, generations=2)
    table = MemWalTable.open(local_location.uri)
    first = table.version
    merge_region(local_location.uri, None, region)
    old = table.refresh().checkout(first)
    assert old.version == first and old.details.merged_generations == {}
    assert table.version > first and table.details.merged_generations == {region: 2}


def test_a_handle_pickles_to_its_uri_and_storage_options(local_location):
    build_table(local_location, regions=1, generations=1)
    table = MemWalTable.open(local_location.uri, {"allow_http": "true"})
    table.index  # noqa: B018 - opened and loaded
    copy = pickle.loads(pickle.dumps(table))
    assert (copy.uri, copy.storage_options) == (table.uri, {"allow_http": "true"})
    assert copy._dataset is None and copy._index is None, "an executor opens the table itself, lazily"
    assert copy.details.merged_generations == table.details.merged_generations
