"""Region manifest: the source of truth for one region's state (memwal-spec.txt, Region Manifest).

Versions start at 1 and are immutable; version N lives at manifest/{bit_reversed(N)}.binpb and is
created with put-if-not-exists. version_hint.json is a best-effort pointer to the latest version.
Fields this library does not name (Lance core writes some) survive a read-modify-write.

Each version we commit carries a fresh commit token (an extra protobuf field readers ignore), so its bytes
are ours alone: a create whose answer was lost and whose retry got 'exists' is recognised as our own by
reading it back (storage.put_if_not_exists), even where two claimers propose the same fields.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from google.protobuf.message import DecodeError

from memwal import naming
from memwal._proto import memwal_pb2
from memwal.errors import (
    CommitConflictError,
    CorruptFileError,
    MemWalError,
    ObjectStoreError,
    RegionNotFoundError,
)
from memwal.storage import ObjectStore

log = logging.getLogger(__name__)

__all__ = [
    "FlushedGeneration",
    "RegionManifest",
    "canonical_region_id",
    "commit_manifest",
    "confirmed_gap",
    "decode_manifest",
    "encode_manifest",
    "latest_version",
    "list_manifest_versions",
    "list_regions",
    "load_latest_manifest",
    "load_manifest",
    "select_regions",
]


@dataclass(frozen=True)
class FlushedGeneration:
    generation: int
    path: str  # directory name relative to the region directory, e.g. "ba7d56d6_gen_1"


@dataclass(frozen=True)
class RegionManifest:
    region_id: str
    version: int
    writer_epoch: int = 0
    replay_after_wal_entry_position: int = 0
    wal_entry_position_last_seen: int = 0
    current_generation: int = 1
    flushed_generations: tuple[FlushedGeneration, ...] = ()
    region_spec_id: int = 0
    # The bytes this manifest was decoded from, so unknown fields are written back unchanged.
    raw: bytes = field(default=b"", repr=False, compare=False)

    def next_version(self, **changes: object) -> RegionManifest:
        """The manifest for version + 1 with the given fields changed (unknown fields kept)."""
        return replace(self, version=self.version + 1, **changes)

    def generation_path(self, generation: int) -> str | None:
        for fg in self.flushed_generations:
            if fg.generation == generation:
                return fg.path
        return None


# The commit token: a protobuf field no spec'd message uses (readers skip unknown fields), 16 random bytes.
COMMIT_TOKEN_FIELD = 1000
_TOKEN_TAG = bytes([(COMMIT_TOKEN_FIELD << 3 | 2) & 0x7F | 0x80, (COMMIT_TOKEN_FIELD << 3 | 2) >> 7])


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[i]
        value |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return value, i
        shift += 7


def _without_token(data: bytes) -> bytes:
    """The serialized message without its top-level commit-token fields (a copied token is not ours)."""
    out, i = bytearray(), 0
    while i < len(data):
        start = i
        key, i = _varint(data, i)
        wire = key & 7
        if wire == 0:
            _, i = _varint(data, i)
        elif wire == 1:
            i += 8
        elif wire == 2:
            length, i = _varint(data, i)
            i += length
        elif wire == 5:
            i += 4
        else:  # groups are not used by these messages; keep the rest untouched
            out += data[start:]
            break
        if key >> 3 != COMMIT_TOKEN_FIELD:
            out += data[start:i]
    return bytes(out)


def encode_manifest(m: RegionManifest, token: bytes | None = None) -> bytes:
    """The manifest's protobuf bytes (unknown fields of `m.raw` kept), with `token` as its commit token."""
    msg = memwal_pb2.RegionManifest()
    if m.raw:
        msg.ParseFromString(m.raw)
    msg.version = m.version
    msg.writer_epoch = m.writer_epoch
    msg.replay_after_wal_entry_position = m.replay_after_wal_entry_position
    msg.wal_entry_position_last_seen = m.wal_entry_position_last_seen
    msg.current_generation = m.current_generation
    msg.region_spec_id = m.region_spec_id
    msg.region_id.uuid = uuid.UUID(m.region_id).bytes
    # Keep each existing entry message (with its unknown fields) when it is unchanged.
    existing = {(fg.generation, fg.path): fg.SerializeToString() for fg in msg.flushed_generations}
    del msg.flushed_generations[:]
    for fg in m.flushed_generations:
        entry = msg.flushed_generations.add()
        raw = existing.get((fg.generation, fg.path))
        if raw is not None:
            entry.ParseFromString(raw)
        else:
            entry.generation = fg.generation
            entry.path = fg.path
    # region_id (field 11) goes last, after the token: a manifest cut anywhere loses it, so no truncation parses
    region = memwal_pb2.RegionManifest()
    region.region_id.CopyFrom(msg.region_id)
    msg.ClearField("region_id")
    data = _without_token(msg.SerializeToString())
    token_field = _TOKEN_TAG + bytes([len(token)]) + token if token else b""
    return data + token_field + region.SerializeToString()


def decode_manifest(data: bytes, path: str) -> RegionManifest:
    """Parse a region manifest; CorruptFileError names the path when it cannot be parsed."""
    msg = memwal_pb2.RegionManifest()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise CorruptFileError(path, f"not a RegionManifest protobuf ({exc})") from exc
    if not data or msg.version == 0:
        raise CorruptFileError(path, "empty manifest or version 0")
    try:
        region_id = str(uuid.UUID(bytes=msg.region_id.uuid))
    except ValueError as exc:
        raise CorruptFileError(path, f"region_id is not 16 UUID bytes ({exc})") from exc
    return RegionManifest(
        region_id=region_id,
        version=msg.version,
        writer_epoch=msg.writer_epoch,
        replay_after_wal_entry_position=msg.replay_after_wal_entry_position,
        wal_entry_position_last_seen=msg.wal_entry_position_last_seen,
        current_generation=msg.current_generation,
        flushed_generations=tuple(
            FlushedGeneration(fg.generation, fg.path) for fg in msg.flushed_generations
        ),
        region_spec_id=msg.region_spec_id,
        raw=data,
    )


def list_regions(store: ObjectStore) -> list[str]:
    """Region ids (UUID directory names) under _mem_wal/."""
    out = []
    for name in store.list_dirs(naming.MEM_WAL_DIR):
        try:
            out.append(str(uuid.UUID(name)))
        except ValueError:
            continue
    return out


def canonical_region_id(region_id: str) -> str:
    """The region id as a canonical UUID string; MemWalError naming it when it is not a UUID."""
    try:
        return str(uuid.UUID(str(region_id)))
    except ValueError:
        raise MemWalError(f"region id {region_id!r} is not a UUID") from None


def select_regions(store: ObjectStore, regions: Sequence[str] | None) -> list[tuple[str, str | None]]:
    """(region id, why it cannot be worked on or None) for the requested regions, or for every region."""
    known = set(list_regions(store))
    if regions is None:
        return [(r, None) for r in sorted(known)]
    out = []
    for r in regions:
        try:
            canonical = canonical_region_id(r)
        except MemWalError as exc:
            out.append((r, str(exc)))
            continue
        out.append((canonical, None if canonical in known else f"region {canonical} has no manifest"))
    return out


def list_manifest_versions(store: ObjectStore, region_id: str) -> list[int]:
    """Every manifest version present for the region, ascending."""
    return naming.list_bit_reversed(store.list_files(naming.manifest_dir(region_id)), naming.MANIFEST_SUFFIX)


def _read_hint(store: ObjectStore, region_id: str) -> int:
    try:
        hint = json.loads(store.get(naming.version_hint_path(region_id)))
        version = int(hint["version"])
        return version if version >= 1 else 1
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return 1


_MAX_PROBES = 64


def _probe_latest(store: ObjectStore, region_id: str) -> int:
    """Hint, then probe forward; the listing only when the hinted version is missing (0: no versions)."""
    start = _read_hint(store, region_id)
    if not store.exists(naming.manifest_path(region_id, start)):
        versions = list_manifest_versions(store, region_id)
        if not versions:
            return 0
        start = versions[-1]
    version = start
    while store.exists(naming.manifest_path(region_id, version + 1)):
        version += 1
    return version


def confirmed_gap(store: ObjectStore, region_id: str, missing: int, listed: Sequence[int]) -> bool:
    """Whether version `missing` is a real gap: absent from one listing that holds a later version, and,
    re-read after that listing, still absent while the version just below it still exists.

    Versions are created in order (a writer creates N+1 only after seeing N), and GC prunes old versions
    oldest first, so a version committed after a probe, or pruned while we looked, never passes both
    re-reads: only a version missing below one that exists does.
    """
    if missing in listed or not any(v > missing for v in listed):
        return False
    if store.exists(naming.manifest_path(region_id, missing)):
        return False  # committed after the probe: a race, not a gap
    return missing > 1 and store.exists(naming.manifest_path(region_id, missing - 1))


def latest_version(store: ObjectStore, region_id: str, *, refuse_gap: bool = False) -> int:
    """The latest manifest version (0 if the region has none): hint, then probe forward.

    If the hinted version is missing (a stale hint after GC of old versions, or a corrupt hint), the
    manifest directory is listed instead. With refuse_gap (a writer about to commit the next version),
    a version listed above the probed one means either a race (committed or pruned meanwhile: probe
    again) or a real gap (`confirmed_gap`: CorruptFileError, a writer must not claim into it).
    """
    for _ in range(_MAX_PROBES):
        version = _probe_latest(store, region_id)
        if not refuse_gap or version == 0:
            return version
        listed = list_manifest_versions(store, region_id)
        if not listed or listed[-1] <= version:
            return version
        if confirmed_gap(store, region_id, version + 1, listed):
            raise CorruptFileError(
                f"{store.uri}/{naming.manifest_path(region_id, version + 1)}",
                f"region {region_id}: manifest version {version + 1} is missing but {listed[-1]} exists; "
                "a writer must not commit into the gap (restore the missing version)",
            )
        log.debug("region %s: manifest versions moved while probing (%d, listed up to %d); probing again",
                  region_id, version, listed[-1])
    raise CommitConflictError(f"region {region_id}: manifest versions kept changing while probing the latest")


def load_manifest(store: ObjectStore, region_id: str, version: int) -> RegionManifest:
    path = naming.manifest_path(region_id, version)
    try:
        data = store.get(path)
    except FileNotFoundError as exc:
        raise RegionNotFoundError(region_id, f"{store.uri}/{path}") from exc
    manifest = decode_manifest(data, f"{store.uri}/{path}")
    if manifest.version != version:
        raise CorruptFileError(f"{store.uri}/{path}", f"holds version {manifest.version}, expected {version}")
    if manifest.region_id != region_id:
        raise CorruptFileError(f"{store.uri}/{path}", f"holds region {manifest.region_id}, expected {region_id}")
    return manifest


def load_latest_manifest(store: ObjectStore, region_id: str, *, refuse_gap: bool = False) -> RegionManifest:
    """The latest manifest. A version pruned between the probe and the read (GC keeps only the newest
    versions, and a writer may commit and GC prune meanwhile) means a newer one exists: probe again."""
    for _ in range(_MAX_PROBES):
        version = latest_version(store, region_id, refuse_gap=refuse_gap)
        if version == 0:
            raise RegionNotFoundError(region_id, f"{store.uri}/{naming.manifest_dir(region_id)}")
        try:
            return load_manifest(store, region_id, version)
        except RegionNotFoundError:
            log.debug("region %s: manifest version %d was pruned after the probe; probing again", region_id, version)
    raise CommitConflictError(f"region {region_id}: manifest versions kept being pruned while reading the latest")


def commit_manifest(store: ObjectStore, manifest: RegionManifest) -> RegionManifest:
    """Create manifest.version with put-if-not-exists (AlreadyExistsError if taken), then the hint.

    The version carries a fresh commit token, so a create whose answer was lost is recognised as ours
    on the client's retry. A manifest listing a generation twice is refused before it is written: merges
    would refuse that region for good."""
    generations = [fg.generation for fg in manifest.flushed_generations]
    if len(set(generations)) != len(generations):
        raise MemWalError(f"{store.uri}: region {manifest.region_id} manifest version {manifest.version} would "
                          f"list a flushed generation twice ({generations}); not committed. A flush whose "
                          "earlier commit was left in doubt by the store may have landed: reopen the writer "
                          "(it replays what the landed version left)")
    data = encode_manifest(manifest, token=uuid.uuid4().bytes)
    store.put_if_not_exists(naming.manifest_path(manifest.region_id, manifest.version), data)
    try:
        store.put(
            naming.version_hint_path(manifest.region_id),
            json.dumps({"version": manifest.version}, separators=(",", ":")).encode(),
        )
    except (OSError, ObjectStoreError):
        pass  # the hint is best effort; readers probe past it
    return replace(manifest, raw=data)
