"""Test helpers: base tables with a primary key, and Lance core's view of a MemWAL table."""

from __future__ import annotations

import lance
import pyarrow as pa
from lance.mem_wal import LsmScanner, ShardSnapshot

from memwal.region_manifest import list_regions, load_latest_manifest
from memwal.storage import ObjectStore, lance_storage_options

PK = {"lance-schema:unenforced-primary-key": "true"}
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("name", pa.string()),
        pa.field("score", pa.float64()),
    ]
)


def rows(ids, tag: str = "v") -> pa.Table:
    ids = list(ids)
    return pa.table(
        {"id": ids, "name": [f"{tag}{i}" for i in ids], "score": [float(i) / 2 for i in ids]}, schema=SCHEMA
    )


def create_base(location, ids=range(10), tag: str = "base") -> lance.LanceDataset:
    return lance.write_dataset(
        rows(ids, tag), location.uri, storage_options=lance_storage_options(location.storage_options)
    )


def open_base(location, version=None) -> lance.LanceDataset:
    return lance.dataset(
        location.uri, version=version, storage_options=lance_storage_options(location.storage_options)
    )


def lance_core_snapshots(location) -> list[ShardSnapshot]:
    """ShardSnapshots of every region, from the region manifests (what Lance core's reader needs)."""
    store = ObjectStore(location.uri, location.storage_options)
    snaps = []
    for region_id in list_regions(store):
        m = load_latest_manifest(store, region_id)
        snap = ShardSnapshot(region_id).with_spec_id(m.region_spec_id).with_current_generation(
            m.current_generation
        )
        for fg in m.flushed_generations:
            snap = snap.with_sstable(fg.generation, fg.path)
        snaps.append(snap)
    return snaps


def lance_core_scan(location) -> pa.Table:
    return LsmScanner.from_snapshots(open_base(location), lance_core_snapshots(location)).to_table()


def sorted_rows(table: pa.Table, columns=("id", "name", "score")) -> list[dict]:
    return sorted(table.select(list(columns)).to_pylist(), key=lambda r: r["id"])


Row = tuple[str, float]


def view(table: pa.Table) -> dict[int, Row]:
    """id -> (name, score) of a table in SCHEMA; fails on a duplicate primary key (a row applied twice)."""
    out: dict[int, Row] = {}
    for r in table.select(["id", "name", "score"]).to_pylist():
        assert r["id"] not in out, f"primary key {r['id']} appears twice: {out[r['id']]} and {r}"
        out[r["id"]] = (r["name"], r["score"])
    return out
