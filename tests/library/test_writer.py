"""The region writer: durability, replay after a crash, thresholds, bad input."""

import time
import uuid

import lance
import pyarrow as pa
import pytest

from memwal import naming
from memwal.errors import CorruptFileError, NoPrimaryKeyError
from memwal.mem_wal_index import initialize_mem_wal, load_index
from memwal.reader import LsmReader
from memwal.region_manifest import load_latest_manifest
from memwal.region_spec import RegionField, RegionSpec
from memwal.table import MemWalTable
from memwal.table_writer import TableWriter, region_id_for
from memwal.writer import RegionWriter, WriterConfig

from support.tables import create_base, lance_core_scan, open_base, rows, sorted_rows

NEVER = WriterConfig(max_memtable_rows=10**9, max_flush_interval_s=None)


def test_acknowledged_puts_survive_a_crash_and_are_replayed(location):
    loc = location
    create_base(loc, ids=[])
    region = str(uuid.uuid4())
    w = RegionWriter(loc.uri, region, storage_options=loc.storage_options, config=NEVER)
    w.put(rows([1, 2]))
    w.delete(pa.table({"id": [1]}))
    del w  # crash: nothing flushed, nothing closed
    w2 = RegionWriter(loc.uri, region, storage_options=loc.storage_options, config=NEVER)
    assert w2.stats.replayed_entries == 2 and w2.writer_epoch == 2
    w2.close()
    assert sorted_rows(LsmReader(MemWalTable(loc.uri, loc.storage_options)).scan()) == sorted_rows(rows([2]))


def test_row_threshold_flushes_generations(local_location):
    create_base(local_location, ids=[])
    region = str(uuid.uuid4())
    with RegionWriter(local_location.uri, region, config=WriterConfig(max_memtable_rows=3)) as w:
        for i in range(7):
            w.put(rows([i]))
    m = load_latest_manifest(local_location.store(), region)
    assert [fg.generation for fg in m.flushed_generations] == [1, 2, 3]
    assert m.current_generation == 4 and m.replay_after_wal_entry_position == 7


def test_interval_threshold_flushes_an_old_memtable(local_location):
    create_base(local_location, ids=[])
    region = str(uuid.uuid4())
    w = RegionWriter(local_location.uri, region, config=WriterConfig(max_memtable_rows=10**9,
                                                                       max_flush_interval_s=0.05))
    w.put(rows([1]))
    time.sleep(0.06)
    w.put(rows([2]))  # the MemTable is older than the interval: this put triggers the flush
    assert w.stats.generations_flushed == 1
    assert load_latest_manifest(local_location.store(), region).current_generation == 2


def test_truncated_wal_entry_stops_replay_with_the_path_and_deletes_nothing(local_location):
    loc = local_location
    create_base(loc, ids=[])
    region = str(uuid.uuid4())
    w = RegionWriter(loc.uri, region, config=NEVER)
    w.put(rows([1]))
    w.put(rows([2]))
    store = loc.store()
    path = naming.wal_entry_path(region, 2)
    data = store.get(path)
    store.delete(path)
    store.put(path, data[: len(data) // 2])
    with pytest.raises(CorruptFileError, match=naming.bit_reversed_name(2)):
        RegionWriter(loc.uri, region, config=NEVER)
    assert store.get(path) == data[: len(data) // 2] and store.exists(naming.wal_entry_path(region, 1))


def test_schema_without_primary_key_is_refused(local_location):
    lance.write_dataset(pa.table({"id": [1]}), local_location.uri)
    with pytest.raises(NoPrimaryKeyError, match="unenforced-primary-key"):
        RegionWriter(local_location.uri, str(uuid.uuid4()))


def test_our_initialisation_with_a_spec_lance_core_cannot_create_reads_in_lance_core(local_location):
    """multi_bucket over (id, name): our initialize_mem_wal writes it; Lance core reads the details,
    our TableWriter routes by it, and Lance core's scanner reads what we wrote."""
    loc = local_location
    create_base(loc, ids=range(4))
    spec = RegionSpec(1, (RegionField("mb", (0, 1), "multi_bucket", None, "int32", {"num_buckets": "3"}),))
    initialize_mem_wal(loc.uri, None, spec)
    core = open_base(loc).mem_wal_index_details()
    assert core["sharding_specs"][0]["fields"][0]["transform"] == "multi_bucket"
    assert load_index(loc.uri).details.region_specs == (spec,)
    with TableWriter(loc.uri, config=NEVER) as tw:
        tw.put(rows(range(2, 40), "tw"))
        tw.delete(pa.table({"id": pa.array([5, 6], pa.int64()), "name": ["tw5", "tw6"]}))
    assert len(tw.writers) == 3, "38 keys over 3 buckets land in 3 regions"
    for region_id, writer in tw.writers.items():
        assert writer.manifest.region_spec_id == 1
        assert region_id in {region_id_for(1, (b,)) for b in range(3)}
    ours = sorted_rows(LsmReader(loc.uri).scan())
    assert ours == sorted_rows(lance_core_scan(loc))
    assert [r["id"] for r in ours] == [0, 1] + [i for i in range(2, 40) if i not in (5, 6)]
