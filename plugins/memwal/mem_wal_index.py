"""The MemWAL index: MemWalIndexDetails stored as the `__lance_mem_wal` entry of the base table.

Reading: Lance's Python API does not return merged_generations or index_catchup, so the details are read
from the table manifest file itself (footer -> Manifest.index_section -> IndexSection -> the entry's
`index_details` Any), as INTEROP.md describes.

Writing: merge progress is committed by Lance merge-insert together with the data (see merge.py).
Everything else (snapshot fields, index_catchup, initialisation) is committed as a CreateIndex that
replaces the entry. Lance rebases such a commit over concurrent merges without treating them as a
conflict, which would silently regress merged_generations (INTEROP.md, measured hazard). So:
- `MemWalTable.commit_details` (the commit loop lives with the handle) inspects every version committed
  between its read version and its own commit and, if it overwrote higher progress, immediately commits a
  repair with the per-region maximum (`fold_progress`);
- `load_index(monotone=True)` takes the same maximum over any rebased rewrite among the last versions, so
  a job of ours never acts on a regressed value even in the instant before the repair lands.
"""

from __future__ import annotations

import logging
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import lance
from google.protobuf.message import DecodeError

from memwal import naming
from memwal._proto import memwal_pb2
from memwal.errors import CorruptFileError, MemWalNotInitializedError, RegionSpecError
from memwal.region_spec import RegionSpec
from memwal.storage import ObjectStore, lance_storage_options, normalize_uri

__all__ = [
    "MAX_COMMIT_ATTEMPTS",
    "MemWalIndex",
    "MemWalIndexDetails",
    "create_index_op",
    "decode_details",
    "encode_details",
    "fold_progress",
    "index_of",
    "initialize_mem_wal",
    "load_index",
    "read_details_at",
    "recent_transactions",
]

log = logging.getLogger(__name__)

U64_MAX = (1 << 64) - 1
_FOOTER = struct.Struct("<QHH4s")
LOOKBACK_VERSIONS = 16
MAX_COMMIT_ATTEMPTS = 16


@dataclass(frozen=True)
class MemWalIndexDetails:
    """Plain form of MemWalIndexDetails. index_catchup: index name -> region id -> generation."""

    snapshot_ts_millis: int = 0
    num_regions: int = 0
    inline_snapshots: bytes | None = None
    region_specs: tuple[RegionSpec, ...] = ()
    maintained_indexes: tuple[str, ...] = ()
    merged_generations: Mapping[str, int] = field(default_factory=dict)
    index_catchup: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    maintain_all_indexes: bool = False
    # Specs this library cannot evaluate (e.g. a transform from a newer Lance core): (spec_id, bytes, why).
    # Jobs that never evaluate specs work on; rewrites write them back unchanged.
    unsupported_region_specs: tuple[tuple[int, bytes, str], ...] = ()
    raw: bytes = field(default=b"", repr=False, compare=False)

    def region_spec(self, spec_id: int) -> RegionSpec:
        """The spec with this id; RegionSpecError naming it if it is missing or unsupported."""
        for spec in self.region_specs:
            if spec.spec_id == spec_id:
                return spec
        for sid, _raw, why in self.unsupported_region_specs:
            if sid == spec_id:
                raise RegionSpecError(f"region spec {spec_id} is not supported by this library: {why}")
        raise RegionSpecError(f"no region spec {spec_id} in the MemWAL index")

    @property
    def newest_region_spec_id(self) -> int:
        ids = [s.spec_id for s in self.region_specs] + [sid for sid, _, _ in self.unsupported_region_specs]
        return max(ids, default=0)

    def merged_generation(self, region_id: str) -> int:
        return self.merged_generations.get(region_id, 0)

    def with_progress_at_least(self, floor: MemWalIndexDetails) -> MemWalIndexDetails:
        """These details with merged_generations and index_catchup raised to at least floor's."""
        merged = dict(self.merged_generations)
        for region, gen in floor.merged_generations.items():
            merged[region] = max(merged.get(region, 0), gen)
        catchup = {name: dict(regions) for name, regions in self.index_catchup.items()}
        for name, regions in floor.index_catchup.items():
            mine = catchup.setdefault(name, {})
            for region, gen in regions.items():
                mine[region] = max(mine.get(region, 0), gen)
        return replace(self, merged_generations=merged, index_catchup=catchup)

    def progress_below(self, floor: MemWalIndexDetails) -> list[str]:
        """Human-readable list of the progress entries where self is lower than floor."""
        lower = [
            f"merged_generations[{r}] {self.merged_generation(r)} < {g}"
            for r, g in floor.merged_generations.items()
            if self.merged_generation(r) < g
        ]
        for name, regions in floor.index_catchup.items():
            mine = self.index_catchup.get(name, {})
            lower += [
                f"index_catchup[{name}][{r}] {mine.get(r, 0)} < {g}"
                for r, g in regions.items()
                if mine.get(r, 0) < g
            ]
        return lower


def _uuid_str(msg: memwal_pb2.UUID) -> str:
    return str(uuid.UUID(bytes=msg.uuid))


def _decode_specs(msg: memwal_pb2.MemWalIndexDetails, where: str) -> tuple[list, list]:
    specs, unsupported = [], []
    for s in msg.region_specs:
        try:
            specs.append(RegionSpec.from_proto(s))
        except RegionSpecError as exc:
            log.warning("%s: region spec %d is kept but not used: %s", where, s.spec_id, exc)
            unsupported.append((s.spec_id, s.SerializeToString(), str(exc)))
    return specs, unsupported


def decode_details(data: bytes, where: str) -> MemWalIndexDetails:
    msg = memwal_pb2.MemWalIndexDetails()
    try:
        msg.ParseFromString(data)
        merged = {_uuid_str(m.region_id): m.generation for m in msg.merged_generations}
        catchup = {
            p.index_name: {_uuid_str(c.region_id): c.generation for c in p.caught_up_generations}
            for p in msg.index_catchup
        }
    except (DecodeError, ValueError) as exc:
        raise CorruptFileError(where, f"MemWalIndexDetails cannot be parsed ({exc})") from exc
    specs, unsupported = _decode_specs(msg, where)
    return MemWalIndexDetails(
        snapshot_ts_millis=msg.snapshot_ts_millis,
        num_regions=msg.num_regions,
        inline_snapshots=msg.inline_snapshots if msg.HasField("inline_snapshots") else None,
        region_specs=tuple(specs),
        unsupported_region_specs=tuple(unsupported),
        maintained_indexes=tuple(msg.maintained_indexes),
        merged_generations=merged,
        index_catchup=catchup,
        maintain_all_indexes=msg.maintain_all_indexes,
        raw=data,
    )


def encode_details(d: MemWalIndexDetails) -> bytes:
    """Serialise, keeping any field of the original bytes this library does not name."""
    msg = memwal_pb2.MemWalIndexDetails()
    if d.raw:
        msg.ParseFromString(d.raw)
    msg.snapshot_ts_millis = d.snapshot_ts_millis
    msg.num_regions = d.num_regions
    if d.inline_snapshots is None:
        msg.ClearField("inline_snapshots")
    else:
        msg.inline_snapshots = d.inline_snapshots
    del msg.region_specs[:]
    msg.region_specs.extend(s.to_proto() for s in d.region_specs)
    for _spec_id, raw, _why in d.unsupported_region_specs:
        msg.region_specs.add().ParseFromString(raw)
    del msg.maintained_indexes[:]
    msg.maintained_indexes.extend(d.maintained_indexes)
    del msg.merged_generations[:]
    for region, gen in sorted(d.merged_generations.items()):
        m = msg.merged_generations.add()
        m.region_id.uuid = uuid.UUID(region).bytes
        m.generation = gen
    del msg.index_catchup[:]
    for name, regions in sorted(d.index_catchup.items()):
        p = msg.index_catchup.add()
        p.index_name = name
        for region, gen in sorted(regions.items()):
            c = p.caught_up_generations.add()
            c.region_id.uuid = uuid.UUID(region).bytes
            c.generation = gen
    msg.maintain_all_indexes = d.maintain_all_indexes
    return msg.SerializeToString()


def _manifest_paths(version: int) -> list[str]:
    # V2 naming (what Lance writes by default): u64::MAX - version, zero-padded to 20 digits; then V1.
    return [f"_versions/{U64_MAX - version:020d}.manifest", f"_versions/{version}.manifest"]


def _read_manifest_file(store: ObjectStore, version: int) -> tuple[str, bytes]:
    for path in _manifest_paths(version):
        try:
            return path, store.get(path)
        except FileNotFoundError:
            continue
    raise FileNotFoundError(f"{store.uri}/_versions: no manifest for version {version}")


def _length_prefixed(data: bytes, offset: int, where: str) -> bytes:
    if offset + 4 > len(data):
        raise CorruptFileError(where, f"offset {offset} past end of file ({len(data)} bytes)")
    (length,) = struct.unpack_from("<I", data, offset)
    if offset + 4 + length > len(data):
        raise CorruptFileError(where, f"section at {offset} of {length} bytes is truncated")
    return data[offset + 4 : offset + 4 + length]


@dataclass(frozen=True)
class _Entry:
    uuid: str
    dataset_version: int
    fields: tuple[int, ...]
    details: MemWalIndexDetails


def _read_entry(store: ObjectStore, version: int) -> _Entry | None:
    """The __lance_mem_wal entry of the table at version, or None if the table has none."""
    path, data = _read_manifest_file(store, version)
    where = f"{store.uri}/{path}"
    if len(data) < _FOOTER.size:
        raise CorruptFileError(where, "shorter than the 16-byte footer")
    manifest_pos, _major, _minor, magic = _FOOTER.unpack_from(data, len(data) - _FOOTER.size)
    if magic != b"LANC":
        raise CorruptFileError(where, f"footer magic {magic!r} is not b'LANC'")
    manifest = memwal_pb2.TableManifest()
    try:
        manifest.ParseFromString(_length_prefixed(data, manifest_pos, where))
        if not manifest.HasField("index_section"):
            return None
        section = memwal_pb2.IndexSection()
        section.ParseFromString(_length_prefixed(data, manifest.index_section, where))
    except DecodeError as exc:
        raise CorruptFileError(where, f"manifest protobuf cannot be parsed ({exc})") from exc
    for meta in section.indices:
        if meta.name != naming.MEM_WAL_INDEX_NAME:
            continue
        if meta.index_details.type_url != naming.MEM_WAL_DETAILS_TYPE_URL:
            raise CorruptFileError(where, f"__lance_mem_wal has type {meta.index_details.type_url!r}")
        return _Entry(
            uuid=_uuid_str(meta.uuid),
            dataset_version=meta.dataset_version,
            fields=tuple(meta.fields),
            details=decode_details(meta.index_details.value, where),
        )
    return None


def read_details_at(store: ObjectStore, version: int) -> MemWalIndexDetails | None:
    """The MemWAL index details at one table version (None if MemWAL was not initialised then)."""
    entry = _read_entry(store, version)
    return entry.details if entry else None


def _details_if_kept(store: ObjectStore, version: int) -> MemWalIndexDetails | None:
    """Details at a version, or None if Lance's version cleanup already removed that version."""
    try:
        return read_details_at(store, version)
    except FileNotFoundError:
        return None


def fold_progress(
    store: ObjectStore, versions: range, floor: MemWalIndexDetails | None
) -> MemWalIndexDetails | None:
    """floor raised to the progress recorded at each of the versions still kept."""
    for version in versions:
        details = _details_if_kept(store, version)
        if details is not None:
            floor = details if floor is None else floor.with_progress_at_least(details)
    return floor


@dataclass(frozen=True)
class MemWalIndex:
    """The MemWAL index as of one base-table version."""

    table_uri: str
    table_version: int
    details: MemWalIndexDetails
    entry_uuid: str
    entry_dataset_version: int

    @property
    def merged_generations(self) -> Mapping[str, int]:
        return self.details.merged_generations


def _open_base(uri: str, storage_options: dict[str, str] | None, version: int | None = None) -> lance.LanceDataset:
    """The base table of a URI not otherwise open (load_index, initialize_mem_wal); jobs carry a handle."""
    return lance.dataset(normalize_uri(uri), version=version, storage_options=lance_storage_options(storage_options))


def recent_transactions(ds: lance.LanceDataset, lookback: int) -> list:
    """ds.get_transactions(lookback), newest first. pylance 14.0.2 cannot convert the transaction of a
    compaction that remapped an index (TypeError from LanceOperation.RewrittenIndex), which fails the whole
    list: then read them one by one, None for each it cannot convert (a Rewrite is never a details rewrite)
    and for each version that version retention (Lance's cleanup) removed."""
    try:
        return ds.get_transactions(recent_transactions=lookback)
    except TypeError:
        out = []
        for version in range(ds.version, max(ds.version - lookback, 0), -1):
            try:
                out.append(ds.read_transaction(version))
            except (TypeError, FileNotFoundError):
                out.append(None)
            except OSError as exc:
                if "not found" not in str(exc).lower():
                    raise
                out.append(None)
        return out


def _progress_floor(ds: lance.LanceDataset, store: ObjectStore) -> MemWalIndexDetails | None:
    """Max progress over the versions that a recent rebased details rewrite may have overwritten."""
    floor: MemWalIndexDetails | None = None
    latest = ds.version
    try:
        recent = recent_transactions(ds, LOOKBACK_VERSIONS)
    except (OSError, ValueError):
        return None
    for offset, txn in enumerate(recent):
        version = latest - offset
        if txn is None or version <= 1:
            continue
        if type(txn.operation).__name__ != "CreateIndex":
            continue
        if not any(i.name == naming.MEM_WAL_INDEX_NAME for i in txn.operation.new_indices):
            continue
        floor = fold_progress(store, range(txn.read_version + 1, version), floor)
    return floor


def index_of(ds: lance.LanceDataset, store: ObjectStore, *, monotone: bool = True) -> MemWalIndex:
    """The MemWAL index of an open dataset at its version; MemWalNotInitializedError if there is none.

    monotone=True raises progress to the floor left by a rebased rewrite (see module docstring).
    """
    entry = _read_entry(store, ds.version)
    if entry is None:
        raise MemWalNotInitializedError(store.uri)
    details = entry.details
    if monotone:
        floor = _progress_floor(ds, store)
        if floor is not None and details.progress_below(floor):
            log.warning("MemWAL index at version %d is below a concurrent merge (%s); using the maximum",
                        ds.version, "; ".join(details.progress_below(floor)))
            details = details.with_progress_at_least(floor)
    return MemWalIndex(store.uri, ds.version, details, entry.uuid, entry.dataset_version)


def load_index(
    uri: str,
    storage_options: dict[str, str] | None = None,
    version: int | None = None,
    *,
    monotone: bool = True,
) -> MemWalIndex:
    """The MemWAL index at version (default latest) of a table not otherwise open (a job carries a
    `memwal.table.MemWalTable` instead); MemWalNotInitializedError if there is none."""
    return index_of(_open_base(uri, storage_options, version), ObjectStore(uri, storage_options), monotone=monotone)


def create_index_op(
    index: MemWalIndex | None, details: MemWalIndexDetails, read_version: int, entry_uuid: str | None = None
) -> Any:
    from lance.dataset import Index

    new = Index(
        uuid=entry_uuid or str(uuid.uuid4()),
        name=naming.MEM_WAL_INDEX_NAME,
        fields=[],
        dataset_version=read_version,
        fragment_ids=set(),
        index_version=0,
        index_details=(naming.MEM_WAL_DETAILS_TYPE_URL, encode_details(details)),
    )
    removed = []
    if index is not None:
        removed.append(
            Index(
                uuid=index.entry_uuid,
                name=naming.MEM_WAL_INDEX_NAME,
                fields=[],
                dataset_version=index.entry_dataset_version,
                fragment_ids=set(),
                index_version=0,
            )
        )
    return lance.LanceOperation.CreateIndex(new_indices=[new], removed_indices=removed)


def initialize_mem_wal(
    uri: str,
    storage_options: dict[str, str] | None,
    region_spec: RegionSpec | None,
    maintained_indexes: list[str] | None = None,
) -> MemWalIndex:
    """Initialise MemWAL on a table with the given region spec (None: manually created regions).

    A table already initialised (by us or by Lance core's initialize_mem_wal) is accepted as it is.
    """
    try:
        return load_index(uri, storage_options)
    except MemWalNotInitializedError:
        pass
    ds = _open_base(uri, storage_options)
    from memwal.primary_key import primary_key_columns

    primary_key_columns(ds.schema, where=uri)
    details = MemWalIndexDetails(
        region_specs=(region_spec,) if region_spec else (),
        maintained_indexes=tuple(maintained_indexes or ()),
        maintain_all_indexes=maintained_indexes is None,
    )
    lance.LanceDataset.commit(
        uri,
        create_index_op(None, details, ds.version),
        read_version=ds.version,
        storage_options=lance_storage_options(storage_options),
    )
    return load_index(uri, storage_options)
