"""Garbage collection of region directories, split per kind (generations, WAL, manifests, leftovers).

A flushed generation (and the WAL entries it holds) is removed only when, for its region, it is
- merged: generation <= merged_generations[region] (latest, monotone read);
- covered by every maintained index: generation <= index_catchup[index][region] for each index with an
  entry; an index with no entry is caught up (as the spec says) only if Lance shows it covering every live
  fragment, else it reads as 0 (an entry can be lost, see memwal.index_coverage);
- not needed by any retained base-table version: generation <= merged_generations[region] as of every
  version Lance still keeps (a time-travel LSM read at version v reads generations above its own
  merged generation).
The region manifest is first rewritten without the removed generations (keeping the writer's epoch),
then the directories are deleted. Also removed: region-manifest versions older than the newest
`keep_manifest_versions`, generation directories that no manifest lists (failed flushes) once older
than the grace period, and abandoned merge staging files once older than the grace period.
`dry_run=True` computes and returns the same plan without deleting anything.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from memwal import naming
from memwal.errors import AlreadyExistsError, MemWalError, RegionNotFoundError
from memwal.faults import fault_point
from memwal.index_coverage import with_coverage
from memwal.job_config import GcConfig
from memwal.lock import LOCK_DIR
from memwal.mem_wal_index import MemWalIndex, read_details_at
from memwal.region_manifest import (
    RegionManifest,
    commit_manifest,
    list_manifest_versions,
    load_latest_manifest,
    load_manifest,
    select_regions,
)
from memwal.storage import ObjectStore
from memwal.table import MemWalTable, TableLike
from memwal.wal import list_wal_positions

__all__ = ["GcAction", "GcConfig", "GcSummary", "gc_table", "plan_region_gc", "safe_generation"]

log = logging.getLogger(__name__)

STAGING_DIR = naming.STAGING_DIR


@dataclass(frozen=True)
class GcAction:
    kind: str  # generation | wal_entry | manifest | failed_flush | staging
    region_id: str | None
    path: str
    bytes: int
    reason: str


@dataclass
class RegionGc:
    region_id: str
    safe_generation: int = 0
    limited_by: str = ""
    actions: list[GcAction] = field(default_factory=list)
    error: str | None = None


@dataclass
class GcSummary:
    table_uri: str
    dry_run: bool
    regions: list[RegionGc] = field(default_factory=list)
    staging: list[GcAction] = field(default_factory=list)
    retained_table_versions: list[int] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def actions(self) -> list[GcAction]:
        return [a for r in self.regions for a in r.actions] + list(self.staging)

    def to_dict(self) -> dict:
        counts: dict[str, int] = {}
        for a in self.actions:
            counts[a.kind] = counts.get(a.kind, 0) + 1
        return {
            **asdict(self),
            "job": "gc",
            "deleted" if not self.dry_run else "would_delete": counts,
            "bytes": sum(a.bytes for a in self.actions),
            "failed_regions": [r.region_id for r in self.regions if r.error],
        }


def _retained_progress(table: MemWalTable) -> dict[int, dict[str, int]]:
    """merged_generations as of every base-table version Lance still keeps (the handle's own version from
    its loaded index, the older ones from their manifests)."""
    store = table.store
    out = {}
    for v in sorted(int(x["version"]) for x in table.dataset.versions()):
        if v == table.version:
            out[v] = dict(table.details.merged_generations)
            continue
        try:
            details = read_details_at(store, v)
        except FileNotFoundError:
            continue  # cleaned up between the listing and the read
        out[v] = dict(details.merged_generations) if details else {}
    return out


def safe_generation(
    index: MemWalIndex, region_id: str, indexes: Sequence[str], retained: dict[int, dict[str, int]]
) -> tuple[int, str]:
    """The highest generation of the region that GC may remove, and what limits it."""
    merged = index.details.merged_generation(region_id)
    safe, why = merged, "merged_generations"
    for name in indexes:
        per_region = index.details.index_catchup.get(name)
        if per_region is not None and per_region.get(region_id, 0) < safe:
            safe, why = per_region.get(region_id, 0), f"index_catchup[{name}]"
    for version, merged_at in retained.items():
        if merged_at.get(region_id, 0) < safe:
            safe, why = merged_at.get(region_id, 0), f"retained table version {version}"
    return safe, why


def _wal_bound(store: ObjectStore, region_id: str, safe: int, versions: list[int]) -> int | None:
    """Highest WAL position held only by generations <= safe: replay_after of the flush of `safe`."""
    for v in versions:
        try:
            m = load_manifest(store, region_id, v)
        except RegionNotFoundError:
            continue  # pruned since the listing (another GC): the bound is then searched above it
        if m.current_generation > safe:
            earlier = m.current_generation == safe + 1 and any(fg.generation == safe for fg in m.flushed_generations)
            return m.replay_after_wal_entry_position if earlier else None
    return None


def plan_region_gc(
    store: ObjectStore,
    index: MemWalIndex,
    region_id: str,
    indexes: Sequence[str],
    retained: dict[int, dict[str, int]],
    config: GcConfig,
    now: float,
) -> RegionGc:
    out = RegionGc(region_id)
    manifest = load_latest_manifest(store, region_id)
    out.safe_generation, out.limited_by = safe_generation(index, region_id, indexes, retained)
    safe = out.safe_generation
    listed = {fg.path for fg in manifest.flushed_generations}
    for fg in manifest.flushed_generations:
        if fg.generation <= safe:
            rel = naming.generation_dir(region_id, fg.path)
            size = sum(m.size for m in store.list(rel))
            out.actions.append(GcAction("generation", region_id, rel, size,
                                        f"generation {fg.generation} <= safe generation {safe}"))
    # Generation directories no manifest lists: failed flushes (or a previous GC's unfinished deletes).
    # One at or above current_generation may be a flush in flight: never touched, whatever the grace period.
    for name in store.list_dirs(naming.region_dir(region_id)):
        gen = naming.parse_generation_dir_name(name)
        if gen is None or name in listed or gen >= manifest.current_generation:
            continue
        rel = naming.generation_dir(region_id, name)
        files = store.list(rel)
        newest = max((f.last_modified.timestamp() for f in files), default=0.0)
        if gen <= safe or now - newest >= config.grace_period_s:
            out.actions.append(GcAction("failed_flush", region_id, rel, sum(f.size for f in files),
                                        f"generation {gen} directory not in the manifest"))
    versions = list_manifest_versions(store, region_id)
    if safe > 0:
        bound = _wal_bound(store, region_id, safe, versions)
        if bound is None:
            log.info("region %s: flush of generation %d no longer in the kept manifests; keeping its WAL",
                     region_id, safe)
        else:
            bound = min(bound, manifest.replay_after_wal_entry_position)
            for pos in list_wal_positions(store, region_id):
                if pos <= bound:
                    rel = naming.wal_entry_path(region_id, pos)
                    meta = store.head(rel)
                    out.actions.append(GcAction("wal_entry", region_id, rel, meta.size if meta else 0,
                                                f"WAL position {pos} <= {bound} (in generations <= {safe})"))
    keep = max(config.keep_manifest_versions, 1)
    # Removing generations commits one more manifest version: keep one fewer of the existing ones.
    existing_kept = max(keep - (1 if any(a.kind == "generation" for a in out.actions) else 0), 1)
    # Oldest first, and executed in this order: a reader that finds a version missing below one that exists
    # can then tell a pruned prefix from a real gap (region_manifest.confirmed_gap).
    for v in versions[:-existing_kept]:
        rel = naming.manifest_path(region_id, v)
        meta = store.head(rel)
        out.actions.append(GcAction("manifest", region_id, rel, meta.size if meta else 0,
                                    f"manifest version {v} older than the newest {keep}"))
    return out


def _prune_manifest(store: ObjectStore, region_id: str, removed: set[str]) -> None:
    """Commit a manifest version without the removed generations (same writer epoch)."""
    for _ in range(32):
        m: RegionManifest = load_latest_manifest(store, region_id, refuse_gap=True)
        kept = tuple(fg for fg in m.flushed_generations if fg.path not in removed)
        if len(kept) == len(m.flushed_generations):
            return
        try:
            commit_manifest(store, m.next_version(flushed_generations=kept))
            return
        except AlreadyExistsError:
            continue
    raise MemWalError(f"region {region_id}: could not commit the pruned manifest")


def _execute(store: ObjectStore, plan: RegionGc) -> None:
    generations = {a.path.rsplit("/", 1)[-1] for a in plan.actions if a.kind == "generation"}
    if generations:
        _prune_manifest(store, plan.region_id, generations)
        fault_point("gc.after_manifest_prune")
    for i, a in enumerate(plan.actions):
        if i == len(plan.actions) // 2:
            fault_point("gc.mid_delete")
        log.info("gc: deleting %s %s (%d bytes): %s", a.kind, a.path, a.bytes, a.reason)
        if a.kind in ("generation", "failed_flush"):
            store.delete_prefix(a.path)
        else:
            store.delete(a.path)


_KEEP_LOCK_OBJECTS = 16


def _prune_locks(store: ObjectStore, dry_run: bool) -> list[GcAction]:
    """Old lock objects: only the newest of each lock is ever read; keep a few for the record."""
    actions = []
    for name in store.list_dirs(LOCK_DIR):
        objects = sorted(store.list_files(f"{LOCK_DIR}/{name}"), key=lambda m: m.path)
        for meta in objects[:-_KEEP_LOCK_OBJECTS]:
            actions.append(GcAction("lock", None, meta.path, meta.size, "superseded lock object"))
            if not dry_run:
                store.delete(meta.path)
    return actions


def gc_table(
    table: TableLike,
    regions: Sequence[str] | None = None,
    config: GcConfig | None = None,
) -> GcSummary:
    """Plan (and unless dry_run, perform) GC for every region (or the given ones)."""
    config = config or GcConfig()
    started = time.monotonic()
    now = datetime.now(UTC).timestamp()
    table = MemWalTable.of(table)
    store = table.store
    table.refresh()
    indexes = table.maintained_indexes()
    index = with_coverage(table.index, table.dataset, indexes)
    retained = _retained_progress(table)
    summary = GcSummary(store.uri, config.dry_run, retained_table_versions=sorted(retained))
    for region_id, problem in select_regions(store, regions):
        if problem:
            summary.regions.append(RegionGc(region_id, error=problem))
            continue
        try:
            plan = plan_region_gc(store, index, region_id, indexes, retained, config, now)
            if not config.dry_run:
                _execute(store, plan)
            summary.regions.append(plan)
        except (MemWalError, OSError) as exc:
            log.error("region %s: gc failed: %s", region_id, exc)
            summary.regions.append(RegionGc(region_id, error=str(exc)))
    summary.staging += _prune_locks(store, config.dry_run)
    for name in store.list_dirs(STAGING_DIR):
        rel = f"{STAGING_DIR}/{name}"
        files = store.list(rel)
        newest = max((f.last_modified.timestamp() for f in files), default=0.0)
        if now - newest >= config.grace_period_s:
            action = GcAction("staging", None, rel, sum(f.size for f in files), "abandoned merge staging")
            summary.staging.append(action)
            if not config.dry_run:
                log.info("gc: deleting staging %s (%d bytes)", rel, action.bytes)
                store.delete_prefix(rel)
    summary.duration_s = time.monotonic() - started
    verb = "would delete" if config.dry_run else "deleted"
    log.info("gc %s %d objects/directories, %d bytes", verb, len(summary.actions),
             sum(a.bytes for a in summary.actions))
    return summary
