"""Test helpers: base tables with a primary key, and Lance core's view of a MemWAL table."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import lance
import pyarrow as pa
import pyarrow.fs as pafs
from lance.mem_wal import LsmScanner, ShardSnapshot

from memwal._proto import memwal_pb2
from memwal.storage import lance_storage_options

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


def indexes_covering_every_fragment(ds: lance.LanceDataset) -> set[str]:
    """Names of the indexes whose segments cover every fragment of ds (read from Lance, not from us)."""
    fragments = {f.fragment_id for f in ds.get_fragments()}
    return {d.name for d in ds.describe_indices()
            if fragments <= {int(f) for seg in d.segments for f in seg.fragment_ids}}


def _filesystem(location) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the table's path in it: a plain listing, none of memwal.storage."""
    if not location.uri.startswith("s3://"):
        return pafs.LocalFileSystem(), location.uri
    o = location.storage_options or {}
    endpoint = o["aws_endpoint"]
    fs = pafs.S3FileSystem(
        access_key=o.get("aws_access_key_id"), secret_key=o.get("aws_secret_access_key"),
        region=o.get("aws_region", "us-east-1"), endpoint_override=endpoint.split("://", 1)[1],
        scheme=endpoint.split("://", 1)[0],
    )
    return fs, location.uri[len("s3://"):]


def _latest_manifest(fs: pafs.FileSystem, region_dir: str) -> memwal_pb2.RegionManifest | None:
    """The highest-numbered region manifest (names are the 64-bit version, bits reversed), decoded with
    the generated protobuf code alone."""
    try:
        infos = fs.get_file_info(pafs.FileSelector(f"{region_dir}/manifest", allow_not_found=True))
    except FileNotFoundError:
        return None
    versions = {
        int(i.base_name[: -len(".binpb")][::-1], 2): i.path for i in infos if i.base_name.endswith(".binpb")
    }
    if not versions:
        return None
    with fs.open_input_stream(versions[max(versions)]) as f:
        msg = memwal_pb2.RegionManifest.FromString(f.read())
    assert msg.version == max(versions), f"{versions[max(versions)]} holds version {msg.version}"
    return msg


def lance_core_snapshots(location) -> list[ShardSnapshot]:
    """ShardSnapshots of every region, for Lance core's reader: built from a plain pyarrow listing and the
    generated protobuf, independently of memwal.region_manifest (so the oracle cannot share its bugs)."""
    fs, root = _filesystem(location)
    regions = fs.get_file_info(pafs.FileSelector(f"{root}/_mem_wal", allow_not_found=True))
    snaps = []
    for region in sorted((i for i in regions if i.type == pafs.FileType.Directory), key=lambda i: i.path):
        m = _latest_manifest(fs, region.path)
        if m is None:
            continue
        snap = ShardSnapshot(region.base_name).with_spec_id(m.region_spec_id).with_current_generation(
            m.current_generation
        )
        for fg in m.flushed_generations:
            snap = snap.with_sstable(fg.generation, fg.path)
        snaps.append(snap)
    return snaps


@contextmanager
def lance_core_env(location) -> Iterator[None]:
    """The one place a test lends S3 settings to the environment: Lance core's LsmPointLookupPlanner opens
    the flushed generations without the base table's storage options (a Lance core gap, not ours), so
    for the duration of the block the environment points at this location's S3 instead of the decoy."""
    o = location.storage_options or {}
    env = {} if not location.uri.startswith("s3://") else {
        "AWS_ENDPOINT": o["aws_endpoint"], "AWS_ENDPOINT_URL": o["aws_endpoint"], "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": o["aws_access_key_id"], "AWS_SECRET_ACCESS_KEY": o["aws_secret_access_key"],
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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
