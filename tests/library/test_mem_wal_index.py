"""The MemWAL index: reading Lance core's details, and rewrites that never regress merge progress."""

import uuid
from dataclasses import replace

import pytest

from memwal.errors import MemWalNotInitializedError
from memwal.mem_wal_index import load_index, read_details_at
from memwal.table import MemWalTable
from memwal.writer import RegionWriter, WriterConfig

from support.maintenance import merge_region, merge_without_our_lock
from support.tables import create_base, open_base, rows


def test_reads_lance_core_initialised_index(local_location):
    loc = local_location
    create_base(loc)
    open_base(loc).initialize_mem_wal(bucket_column="id", num_buckets=4)
    index = load_index(loc.uri)
    spec = index.details.region_specs[0]
    assert spec.spec_id == 1 and spec.fields[0].transform == "bucket"
    assert spec.fields[0].parameters == {"num_buckets": "4"}
    assert index.details.maintain_all_indexes is True


def test_table_without_mem_wal_is_a_clear_error(local_location):
    create_base(local_location)
    with pytest.raises(MemWalNotInitializedError, match="initialise MemWAL"):
        load_index(local_location.uri)


def test_rewrite_keeps_fields_it_does_not_own_and_lance_core_still_reads_it(local_location):
    loc = local_location
    create_base(loc)
    open_base(loc).initialize_mem_wal(bucket_column="id", num_buckets=4)
    MemWalTable(loc.uri).commit_details(lambda d: replace(d, snapshot_ts_millis=1234))
    index = load_index(loc.uri)
    assert index.details.snapshot_ts_millis == 1234
    core = open_base(loc).mem_wal_index_details()
    assert core["num_shards"] == 4 and core["sharding_specs"][0]["fields"][0]["transform"] == "bucket"


def test_rewrite_racing_a_merge_never_regresses_merged_generations(location):
    """
    INTEROP hazard, staged exactly: the rewrite reads at version R (merged 1); a merger that does not take
    our index lock (another tool) commits generation 2 at R+1; the rewrite commits with read_version R
    and Lance accepts it (merged back to 1).
    commit_details must repair it to 2, and load_index(monotone) must read 2 even at the regressed version.
    """
    loc = location
    create_base(loc)
    open_base(loc).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    with RegionWriter(loc.uri, region, storage_options=loc.storage_options,
                      config=WriterConfig(max_memtable_rows=1, max_flush_interval_s=None)) as w:
        w.put(rows([100]))
        w.put(rows([101]))
    merge_region(loc.uri, loc.storage_options, region, up_to_generation=1)
    read_version = open_base(loc).version

    def mutate_while_a_merge_lands(details):
        if open_base(loc).version == read_version:
            # generation 2 lands at R+1, merged by a tool that does not take our index lock
            merge_without_our_lock(loc.uri, loc.storage_options, region)
        return replace(details, snapshot_ts_millis=42)

    final = MemWalTable(loc.uri, loc.storage_options).commit_details(mutate_while_a_merge_lands)
    assert final.merged_generations[region] == 2, "the rewrite must not leave merged_generations regressed"
    assert final.details.snapshot_ts_millis == 42
    store = loc.store()
    regressed = read_version + 2
    assert read_details_at(store, regressed).merged_generation(region) == 1, (
        "the scenario must really produce Lance's rebased, regressed version"
    )
    assert load_index(loc.uri, loc.storage_options, version=regressed).merged_generations[region] == 2, (
        "a monotone read at the regressed version must take the floor of what it overwrote"
    )
    assert final.table_version == regressed + 1, "the repair must land right after the regressed version"
    assert open_base(loc).mem_wal_index_details()["num_shards"] == 1, "Lance core still reads the details"
