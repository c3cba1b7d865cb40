import uuid

import pytest

from memwal import naming
from memwal.errors import AlreadyExistsError, CorruptFileError, RegionNotFoundError
from memwal.region_manifest import (
    FlushedGeneration,
    RegionManifest,
    commit_manifest,
    decode_manifest,
    encode_manifest,
    latest_version,
    load_latest_manifest,
)

REGION = str(uuid.uuid4())


def _commit_versions(store, n):
    m = RegionManifest(REGION, 1, writer_epoch=1)
    commit_manifest(store, m)
    for _ in range(n - 1):
        m = m.next_version(current_generation=m.current_generation + 1)
        commit_manifest(store, m)
    return m


def test_latest_version_follows_hint_then_probes(location):
    store = location.store()
    _commit_versions(store, 5)
    assert latest_version(store, REGION) == 5
    store.put(naming.version_hint_path(REGION), b'{"version":2}')  # stale hint
    assert latest_version(store, REGION) == 5
    store.put(naming.version_hint_path(REGION), b"garbage")
    assert latest_version(store, REGION) == 5


def test_latest_version_survives_gc_of_early_versions_without_hint(location):
    store = location.store()
    _commit_versions(store, 4)
    store.delete(naming.version_hint_path(REGION))
    store.delete(naming.manifest_path(REGION, 1))
    store.delete(naming.manifest_path(REGION, 2))
    assert latest_version(store, REGION) == 4


def test_commit_is_create_only(location):
    store = location.store()
    m = _commit_versions(store, 2)
    with pytest.raises(AlreadyExistsError):
        commit_manifest(store, m)


def test_unknown_fields_survive_read_modify_write():
    """Lance core writes FlushedGeneration fields 3, 4, 5 that the spec does not name."""
    from memwal._proto import memwal_pb2

    msg = memwal_pb2.RegionManifest(version=3, writer_epoch=2, current_generation=2)
    msg.region_id.uuid = uuid.UUID(REGION).bytes
    fg = msg.flushed_generations.add(generation=1, path="ba7d56d6_gen_1")
    extra = b"\x18\x4d\x20\x03\x28\x18"  # fields 3=77, 4=3, 5=24 as Lance core wrote them
    data = msg.SerializeToString()
    fg_bytes = fg.SerializeToString() + extra
    data = memwal_pb2.RegionManifest()
    data.ParseFromString(msg.SerializeToString())
    del data.flushed_generations[:]
    data.flushed_generations.add().ParseFromString(fg_bytes)
    raw = data.SerializeToString() + b"\xa0\x06\x07"  # and an unknown top-level field 100 = 7
    m = decode_manifest(raw, "mem")
    m2 = m.next_version(flushed_generations=(*m.flushed_generations, FlushedGeneration(2, "0000abcd_gen_2")))
    out = encode_manifest(m2)
    assert extra in out, "unknown FlushedGeneration fields must be written back"
    assert b"\xa0\x06\x07" in out, "unknown top-level fields must be written back"
    assert decode_manifest(out, "mem").flushed_generations[1] == FlushedGeneration(2, "0000abcd_gen_2")


def test_corrupt_manifest_names_the_file(location):
    store = location.store()
    _commit_versions(store, 2)
    path = naming.manifest_path(REGION, 2)
    good = store.get(path)
    store.delete(path)
    store.put(path, good[:7])
    with pytest.raises(CorruptFileError, match=naming.bit_reversed_name(2)):
        load_latest_manifest(store, REGION)
    assert store.get(path) == good[:7], "a reader must not touch a corrupt file"


def test_missing_region_is_a_clear_error(location):
    with pytest.raises(RegionNotFoundError, match=REGION):
        load_latest_manifest(location.store(), REGION)
