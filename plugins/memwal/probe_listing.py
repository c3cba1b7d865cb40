"""The due-work probe's two requests and what they say (`memwal.probe`): one LIST of `_versions/` (the base
table's versions with each manifest's time) and one recursive LIST of `_mem_wal/` (every region's manifest
versions, the generation directories' files, merge staging). Nothing else is read here."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from memwal import naming
from memwal.mem_wal_index import U64_MAX
from memwal.storage import ObjectMeta, ObjectStore

__all__ = ["GenDir", "Listing", "base_versions", "read_listings"]

_MANIFEST_NAME = re.compile(r"^(\d+)\.manifest$")


@dataclass
class GenDir:
    """One generation directory as listed: its files' oldest and newest times, bytes, bytes under data/."""

    oldest: float = float("inf")
    newest: float = 0.0
    bytes: int = 0
    data_bytes: int = 0


@dataclass
class Listing:
    """What the two listings say."""

    versions: list[tuple[int, float]]  # (base version, last-modified), ascending
    manifests: dict[str, list[int]] = field(default_factory=dict)  # region -> manifest versions
    gen_dirs: dict[str, dict[str, GenDir]] = field(default_factory=dict)  # region -> directory name -> files
    staging: dict[str, float] = field(default_factory=dict)  # staging directory -> newest file's time

    @property
    def region_versions(self) -> dict[str, int]:
        return {r: max(v) for r, v in sorted(self.manifests.items()) if v}


def base_versions(metas: Iterable[ObjectMeta]) -> list[tuple[int, float]]:
    """Versions named in `_versions/` (V2 names: u64::MAX - version, 20 digits; V1: the version)."""
    out = []
    for meta in metas:
        match = _MANIFEST_NAME.match(meta.path.rsplit("/", 1)[-1])
        if match:
            digits = match.group(1)
            version = U64_MAX - int(digits) if len(digits) == 20 else int(digits)
            out.append((version, meta.last_modified.timestamp()))
    return sorted(out)


def _is_region(name: str) -> bool:
    try:
        return str(uuid.UUID(name)) == name
    except ValueError:
        return False


def read_listings(store: ObjectStore) -> Listing:
    """The probe's two requests: `_versions/` (one level) and `_mem_wal/` (recursive)."""
    out = Listing(base_versions(store.list_files("_versions")))
    if not out.versions:
        return out
    staging_prefix = naming.STAGING_DIR + "/"
    for meta in store.list(naming.MEM_WAL_DIR):
        parts = meta.path.split("/")
        when = meta.last_modified.timestamp()
        if meta.path.startswith(staging_prefix) and len(parts) > 3:
            out.staging[parts[2]] = max(out.staging.get(parts[2], 0.0), when)
            continue
        if len(parts) < 4 or not _is_region(parts[1]):
            continue
        region, sub = parts[1], parts[2]
        if sub == naming.MANIFEST_DIR and parts[3].endswith(naming.MANIFEST_SUFFIX):
            try:
                out.manifests.setdefault(region, []).append(naming.parse_bit_reversed_name(parts[3]))
            except ValueError:
                continue
        elif naming.parse_generation_dir_name(sub) is not None:
            d = out.gen_dirs.setdefault(region, {}).setdefault(sub, GenDir())
            d.oldest, d.newest = min(d.oldest, when), max(d.newest, when)
            d.bytes += meta.size
            d.data_bytes += meta.size if parts[3] == "data" else 0
    for versions in out.manifests.values():
        versions.sort()
    return out
