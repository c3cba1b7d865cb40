"""The probe's two listings (memwal.probe_listing): what they say of a table's objects, laid out by hand."""

from __future__ import annotations

import os

from memwal import naming
from memwal.mem_wal_index import U64_MAX
from memwal.probe_listing import read_listings
from memwal.storage import ObjectStore

R1 = "6f1c3a52-0d4e-4a57-9b1e-6f0c2b9d1e11"
R2 = "0a6b8e0e-3c9f-4d47-8f55-2a6f1b7d9c22"


def _write(root, path: str, size: int = 1) -> None:
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as f:
        f.write(b"x" * size)


def test_versions_region_manifests_generation_dirs_and_staging(tmp_path):
    root = str(tmp_path)
    for version in (3, 4):
        _write(root, f"_versions/{U64_MAX - version:020d}.manifest")  # V2 names
    _write(root, "_versions/2.manifest")  # a V1 name
    _write(root, "_versions/notes.txt")
    for version in (1, 2, 5):
        _write(root, naming.manifest_path(R1, version))
    _write(root, naming.version_hint_path(R1))
    _write(root, naming.manifest_path(R2, 1))
    _write(root, naming.wal_entry_path(R1, 1), 50)
    _write(root, f"{naming.region_dir(R1)}/aaaaaaaa_gen_1/data/f.lance", 30)
    _write(root, f"{naming.region_dir(R1)}/aaaaaaaa_gen_1/_versions/1.manifest", 4)
    _write(root, f"{naming.STAGING_DIR}/merge-1/part.arrow")
    _write(root, "_mem_wal/_locks/index/0001")
    _write(root, "_mem_wal/not-a-region/manifest/x.binpb")
    listing = read_listings(ObjectStore(root))
    assert [v for v, _ in listing.versions] == [2, 3, 4]
    assert listing.manifests == {R1: [1, 2, 5], R2: [1]}
    assert listing.region_versions == {R2: 1, R1: 5}
    gen = listing.gen_dirs[R1]["aaaaaaaa_gen_1"]
    assert (gen.bytes, gen.data_bytes) == (34, 30) and gen.oldest <= gen.newest
    assert list(listing.staging) == ["merge-1"] and set(listing.gen_dirs) == {R1}


def test_no_lance_table_lists_nothing_more(tmp_path):
    _write(str(tmp_path), f"{naming.region_dir(R1)}/manifest/{naming.bit_reversed_name(1)}.binpb")
    listing = read_listings(ObjectStore(str(tmp_path)))
    assert listing.versions == [] and listing.manifests == {}, "no _versions/: `_mem_wal/` is not listed"
    assert read_listings(ObjectStore(str(tmp_path / "missing"))).versions == []
