"""The spec's Appendix 1 (writer fencing) on real storage, local and S3."""

import uuid

import pyarrow as pa
import pytest

from memwal import naming, wal
from memwal.errors import FencedError
from memwal.region_manifest import RegionManifest, commit_manifest, latest_version, load_latest_manifest
from memwal.schema import with_tombstone
from memwal.writer import RegionWriter, WriterConfig

from support.tables import SCHEMA, create_base, rows

NEVER = WriterConfig(max_memtable_rows=10**9, max_flush_interval_s=None)


def _initial_state(location, region):
    """Region manifest v1: writer_epoch 5, replay_after 10, last_seen 12; WAL entries 11 and 12 exist."""
    store = location.store()
    commit_manifest(store, RegionManifest(region, 1, writer_epoch=5, replay_after_wal_entry_position=10,
                                          wal_entry_position_last_seen=12, current_generation=3))
    for pos in (11, 12):
        data = wal.encode_wal_entry(with_tombstone(rows([pos]), SCHEMA, False), writer_epoch=5, generation=3)
        wal.write_wal_entry(store, region, pos, data)
    return store


def test_appendix_1_fenced_writer_aborts_and_loses_nothing(location):
    """
    step | writer A (epoch 6)         | writer B (epoch 7)
    1-2  | claims: manifest v2        |
    3    | writes WAL 13, 14, 15      |
    4-5  |                            | claims: manifest v3, replays 11..15
    6    |                            | writes WAL 16, 17
    7-9  | flush: sees epoch 7 > 6 -> fenced, aborts, commits nothing
    10   |                            | flushes: generation holds rows 11..17
    """
    create_base(location, ids=[])
    region = str(uuid.uuid4())
    store = _initial_state(location, region)
    a = RegionWriter(location.uri, region, storage_options=location.storage_options, config=NEVER)
    assert a.writer_epoch == 6 and latest_version(store, region) == 2
    for i in (13, 14, 15):
        a.put(rows([i]))
    assert wal.read_wal_entry(store, region, 15).writer_epoch == 6

    b = RegionWriter(location.uri, region, storage_options=location.storage_options, config=NEVER)
    assert b.writer_epoch == 7 and latest_version(store, region) == 3
    assert b.stats.replayed_entries == 5, "B replays 11..15, including A's entries with epoch 6 <= 7"
    for i in (16, 17):
        b.put(rows([i]))

    with pytest.raises(FencedError, match="local writer_epoch 6 < stored 7"):
        a.flush()
    assert latest_version(store, region) == 3, "a fenced writer must not commit a manifest version"
    with pytest.raises(Exception, match="closed"):
        a.put(rows([99]))

    flushed = b.flush()
    m = load_latest_manifest(store, region)
    assert m.version == 4 and m.writer_epoch == 7
    assert m.flushed_generations[-1] == flushed and m.replay_after_wal_entry_position == 17
    import lance

    from support.tables import open_base  # noqa: F401  (kept close to use)

    gen = lance.dataset(store.uri_of(naming.generation_dir(region, flushed.path)),
                        storage_options=location.storage_options).to_table()
    assert sorted(gen.column("id").to_pylist()) == [11, 12, 13, 14, 15, 16, 17], "no acknowledged write lost"


def test_fenced_writer_entry_written_after_takeover_is_absorbed(local_location):
    """A (epoch 1) writes position 1 after B (epoch 2) claimed: B's put collides, absorbs it, goes on."""
    location = local_location
    create_base(location, ids=[])
    region = str(uuid.uuid4())
    a = RegionWriter(location.uri, region, config=NEVER)
    b = RegionWriter(location.uri, region, config=NEVER)
    a.put(rows([1], "from-a"))  # acknowledged to A's client
    b.put(rows([2], "from-b"))
    assert b.stats.absorbed_entries == 1
    assert sorted(b.memtable_table().column("id").to_pylist()) == [1, 2]
    with pytest.raises(FencedError):
        a.put(rows([3]))  # position 2 holds B's entry (epoch 2): A learns it is fenced


def test_writer_refuses_a_region_id_that_is_not_a_uuid(local_location):
    create_base(local_location, ids=[])
    with pytest.raises(Exception, match="not-a-uuid"):
        RegionWriter(local_location.uri, "not-a-uuid")


def test_wal_entry_carries_epoch_and_tombstone(local_location):
    create_base(local_location, ids=[])
    region = str(uuid.uuid4())
    w = RegionWriter(local_location.uri, region, config=NEVER)
    w.delete(pa.table({"id": [4]}))
    entry = wal.read_wal_entry(local_location.store(), region, 1)
    assert entry.writer_epoch == 1 and entry.generation == 1
    assert entry.table.column("_tombstone").to_pylist() == [True]


def test_lance_core_claims_and_flushes_a_region_whose_manifests_carry_our_commit_token(local_location):
    """Our manifest versions carry a commit token (protobuf field 1000, issue 42); Lance core's region writer
    reads them, claims the next epoch and flushes, and we read its versions back."""
    import lance

    from memwal.region_manifest import COMMIT_TOKEN_FIELD

    from support.tables import open_base

    loc = local_location
    create_base(loc, ids=range(3))
    open_base(loc).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    with RegionWriter(loc.uri, region, config=NEVER) as w:
        w.put(rows([5]))
        w.flush()
    store = loc.store()
    ours = store.get(naming.manifest_path(region, latest_version(store, region)))
    tag = COMMIT_TOKEN_FIELD << 3 | 2  # a length-delimited field: its two-byte varint key, then length 16
    assert bytes([tag & 0x7F | 0x80, tag >> 7, 16]) in ours
    with lance.dataset(loc.uri).mem_wal_writer(region, max_memtable_rows=1) as core:
        core.put(rows([6]))
    m = load_latest_manifest(store, region)
    assert m.writer_epoch == 2, "Lance core claimed the epoch after ours"
    assert [fg.generation for fg in m.flushed_generations] == [1, 2]
