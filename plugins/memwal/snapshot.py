"""Snapshot refresh: summarise every region manifest into the MemWAL index.

One row per region with the spec's region snapshot schema (memwal-spec.txt, Region Snapshot Arrow
Schema), including a `region_field_{field_id}` column per region-spec field, whose value is computed by
evaluating the region's spec on one of its rows. Up to `inline_threshold` regions the rows are stored
as Lance file bytes in `inline_snapshots`; above it, as `_indices/{entry uuid}/index.lance`.
The commit goes through `commit_details`, so it never overwrites merge progress or index catch-up.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any

import lance
import pyarrow as pa
from lance.file import LanceFileReader, LanceFileWriter

from memwal import naming, wal
from memwal.errors import MemWalError
from memwal.faults import fault_point
from memwal.field_ids import source_names_from_schema
from memwal.generation import open_generation
from memwal.job_config import DEFAULT_INLINE_THRESHOLD
from memwal.mem_wal_index import MemWalIndexDetails, recent_transactions
from memwal.region_manifest import RegionManifest, load_latest_manifest
from memwal.region_spec import RegionSpec
from memwal.storage import ObjectStore
from memwal.table import MemWalTable, TableLike
from memwal.transforms import evaluate

__all__ = [
    "DEFAULT_INLINE_THRESHOLD",
    "SnapshotSummary",
    "decode_snapshot",
    "encode_snapshot",
    "read_snapshot",
    "refresh_snapshot",
    "snapshot_schema",
    "snapshot_table",
]

log = logging.getLogger(__name__)

SNAPSHOT_FILE = "index.lance"
_TS_KEY = b"snapshot_ts_millis"

_BASE_FIELDS = [
    pa.field("region_id", pa.binary(16)),
    pa.field("version", pa.uint64()),
    pa.field("region_spec_id", pa.uint32()),
    pa.field("writer_epoch", pa.uint64()),
    pa.field("replay_after_wal_entry_position", pa.uint64()),
    pa.field("wal_entry_position_last_seen", pa.uint64()),
    pa.field("current_generation", pa.uint64()),
    pa.field(
        "flushed_generations",
        pa.list_(pa.struct([pa.field("generation", pa.uint64()), pa.field("path", pa.string())])),
    ),
]


@dataclass
class SnapshotSummary:
    table_uri: str
    num_regions: int = 0
    storage: str = "inline"  # or "external"
    snapshot_ts_millis: int = 0
    table_version: int = 0
    bytes: int = 0
    regions_skipped: list[str] | None = None
    duration_s: float = 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "job": "snapshot", "commits": 1}


def snapshot_schema(specs: Sequence[RegionSpec], base_schema: pa.Schema) -> pa.Schema:
    """The spec's region snapshot schema plus one region_field_ column per field of every spec."""
    fields = list(_BASE_FIELDS)
    seen = {f.name for f in fields}
    for spec in specs:
        sample = evaluate(spec, base_schema.empty_table(), source_names_from_schema(base_schema))
        for f in sample.schema:
            if f.name not in seen:
                fields.append(f)
                seen.add(f.name)
    return pa.schema(fields)


def _one_row(store: ObjectStore, m: RegionManifest) -> pa.Table | None:
    """Any one row of the region (its values decide the region field values)."""
    for fg in sorted(m.flushed_generations, key=lambda g: g.generation):
        try:
            t = open_generation(store, m.region_id, fg.generation, fg.path).to_table(limit=1)
        except (MemWalError, OSError, pa.ArrowException):  # collected by GC meanwhile
            continue
        if t.num_rows:
            return t
    for position in (m.replay_after_wal_entry_position + 1, m.replay_after_wal_entry_position):
        entry = wal.read_wal_entry(store, m.region_id, max(position, wal.FIRST_POSITION))
        if entry is not None and entry.table.num_rows:
            return entry.table.slice(0, 1)
    return None


def region_field_values(
    store: ObjectStore, m: RegionManifest, specs: Sequence[RegionSpec], base_schema: pa.Schema
) -> dict[str, Any]:
    spec = next((s for s in specs if s.spec_id == m.region_spec_id), None)
    if spec is None:
        return {}
    row = _one_row(store, m)
    if row is None:
        return {}
    values = evaluate(spec, row, source_names_from_schema(base_schema))
    return {name: values.column(name)[0].as_py() for name in values.column_names}


def snapshot_table(
    store: ObjectStore, manifests: Sequence[RegionManifest], specs: Sequence[RegionSpec], base_schema: pa.Schema
) -> pa.Table:
    schema = snapshot_schema(specs, base_schema)
    rows = []
    for m in manifests:
        row: dict[str, Any] = {
            "region_id": uuid.UUID(m.region_id).bytes,
            "version": m.version,
            "region_spec_id": m.region_spec_id,
            "writer_epoch": m.writer_epoch,
            "replay_after_wal_entry_position": m.replay_after_wal_entry_position,
            "wal_entry_position_last_seen": m.wal_entry_position_last_seen,
            "current_generation": m.current_generation,
            "flushed_generations": [
                {"generation": fg.generation, "path": fg.path} for fg in m.flushed_generations
            ],
        }
        row.update(region_field_values(store, m, specs, base_schema))
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=schema)


def encode_snapshot(table: pa.Table) -> bytes:
    """The region snapshot rows as the bytes of a Lance file (for inline_snapshots)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, SNAPSHOT_FILE)
        with LanceFileWriter(path, table.schema) as writer:
            if table.num_rows:
                writer.write_batch(table)
        with open(path, "rb") as f:
            return f.read()


def decode_snapshot(data: bytes) -> pa.Table:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, SNAPSHOT_FILE)
        with open(path, "wb") as f:
            f.write(data)
        return LanceFileReader(path).read_all().to_table()


def _snapshot_entry_uuids(ds: lance.LanceDataset, lookback: int) -> list[str]:
    """UUIDs the __lance_mem_wal entry had in recent details rewrites, newest first."""
    out = []
    for txn in recent_transactions(ds, lookback):
        if txn is not None and type(txn.operation).__name__ == "CreateIndex":
            out += [i.uuid for i in txn.operation.new_indices if i.name == naming.MEM_WAL_INDEX_NAME]
    return out


def read_snapshot(table: TableLike, lookback: int = 100) -> pa.Table | None:
    """The region snapshot rows recorded in the MemWAL index (inline or external), or None.

    An external snapshot lives at _indices/{entry uuid}/index.lance, but a merge commit gives the
    __lance_mem_wal entry a fresh UUID (Lance core), so the file is looked up under the UUID of the
    commit that wrote it (stamped with snapshot_ts_millis). A snapshot that can no longer be found is
    stale metadata, not an error: None is returned and the next refresh rebuilds it.
    """
    table = MemWalTable.of(table)
    index = table.index
    d = index.details
    if d.inline_snapshots is not None:
        return decode_snapshot(d.inline_snapshots)
    if d.num_regions == 0:
        return None
    store = table.store
    for entry_uuid in [index.entry_uuid, *_snapshot_entry_uuids(table.dataset, lookback)]:
        try:
            table = decode_snapshot(store.get(f"_indices/{entry_uuid}/{SNAPSHOT_FILE}"))
        except FileNotFoundError:
            continue
        if (table.schema.metadata or {}).get(_TS_KEY) == str(d.snapshot_ts_millis).encode():
            return table
    log.warning("external region snapshot of %s (ts %d) is gone; run a snapshot refresh",
                table.uri, d.snapshot_ts_millis)
    return None


ManifestReader = Callable[[ObjectStore, Sequence[str]], list[RegionManifest]]


def read_manifests_threaded(store: ObjectStore, region_ids: Sequence[str]) -> list[RegionManifest]:
    """Latest manifest of each region, read in parallel (the Spark job supplies its own reader)."""
    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(lambda r: load_latest_manifest(store, r), region_ids))


def refresh_snapshot(
    table: TableLike,
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
    read_manifests: ManifestReader = read_manifests_threaded,
) -> SnapshotSummary:
    """Rebuild the region snapshots from every region manifest and commit them to the MemWAL index."""
    started = time.monotonic()
    table = MemWalTable.of(table)
    store = table.store
    index = table.refresh().index
    base_schema = table.schema
    region_ids = table.regions()
    manifests = read_manifests(store, region_ids)
    rows = snapshot_table(store, manifests, index.details.region_specs, base_schema)
    ts = int(time.time() * 1000)
    data = encode_snapshot(rows.replace_schema_metadata({_TS_KEY: str(ts).encode()}))
    external = len(manifests) > inline_threshold

    def prepare(entry_uuid: str) -> None:
        if external:
            store.put(f"_indices/{entry_uuid}/{SNAPSHOT_FILE}", data)
            fault_point("snapshot.after_external_write")

    def mutate(d: MemWalIndexDetails) -> MemWalIndexDetails:
        return replace(
            d, snapshot_ts_millis=ts, num_regions=len(manifests), inline_snapshots=None if external else data
        )

    committed = table.commit_details(mutate, prepare=prepare)
    summary = SnapshotSummary(
        table_uri=store.uri,
        num_regions=len(manifests),
        storage="external" if external else "inline",
        snapshot_ts_millis=ts,
        table_version=committed.table_version,
        bytes=len(data),
        duration_s=time.monotonic() - started,
    )
    log.info("snapshot of %d regions committed at version %d (%s, %d bytes)",
             summary.num_regions, summary.table_version, summary.storage, summary.bytes)
    return summary
