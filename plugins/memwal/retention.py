"""Version retention: remove base-table versions the table's policy no longer promises (Lance's
`cleanup_old_versions`), so that GC may then free the generations those versions still needed.

Plan, then run (like pyiceberg's ExpireSnapshots): `plan_retention` lists every version with what it
would free and why it is kept; `retain_versions` removes exactly the planned versions (Lance's `versions=`)
unless `dry_run`. A version is removed only when all of these hold:
- it is older than `older_than_s` (the time travel the policy promises);
- it is not among the newest `keep_versions` versions, and it is not the latest;
- it carries no tag (tagged versions are always kept, never an error);
- it is not in the window the rebase repair reads (`mem_wal_index.load_index`: the versions between a
  recent MemWAL index rewrite's read version and its commit, whose progress the repair folds in).
`_mem_wal/` is never touched here (Lance's cleanup does not look at it); GC owns it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta

import lance

from memwal import naming
from memwal.errors import MemWalError
from memwal.maintenance_config import RetentionConfig
from memwal.mem_wal_index import _LOOKBACK_VERSIONS, recent_transactions
from memwal.storage import ObjectStore
from memwal.table import MemWalTable, TableLike

__all__ = ["RetentionConfig", "RetentionPlan", "RetentionSummary", "VersionEntry", "plan_retention",
           "repair_window", "retain_versions"]

log = logging.getLogger(__name__)


@dataclass
class VersionEntry:
    """One table version in a plan: its age, tags, the bytes only it references, and the verdict."""

    version: int
    timestamp: str
    tags: list[str] = field(default_factory=list)
    bytes: int = 0
    remove: bool = False
    reason: str = ""


@dataclass
class RetentionPlan:
    table_uri: str
    latest_version: int
    versions: list[VersionEntry] = field(default_factory=list)

    @property
    def to_remove(self) -> list[int]:
        return [v.version for v in self.versions if v.remove]

    @property
    def retained(self) -> list[int]:
        return [v.version for v in self.versions if not v.remove]

    @property
    def bytes(self) -> int:
        return sum(v.bytes for v in self.versions if v.remove)


@dataclass
class RetentionSummary:
    table_uri: str
    dry_run: bool
    enabled: bool = True
    versions_before: int = 0
    versions_removed: list[int] = field(default_factory=list)
    bytes_removed: int = 0
    oldest_retained_version: int | None = None
    retained_versions: list[int] = field(default_factory=list)
    versions: list[VersionEntry] = field(default_factory=list)
    duration_s: float = 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(job="retention", num_versions_removed=len(self.versions_removed),
                   num_versions_retained=len(self.retained_versions))
        return out


def repair_window(ds: lance.LanceDataset) -> set[int]:
    """Versions the rebase repair may still read: those between a recent MemWAL index rewrite's read
    version and its own version (empty when no rewrite in the lookback was rebased)."""
    latest = ds.version
    out: set[int] = set()
    try:
        recent = recent_transactions(ds, _LOOKBACK_VERSIONS)
    except (OSError, ValueError):
        recent = []
    for offset, txn in enumerate(recent):
        if txn is None or type(txn.operation).__name__ != "CreateIndex":
            continue
        if any(i.name == naming.MEM_WAL_INDEX_NAME for i in txn.operation.new_indices):
            out.update(range(txn.read_version + 1, latest - offset))
    return out


def _files(ds: lance.LanceDataset) -> dict[str, int]:
    """Data and deletion files a version references, with their sizes (deletion files sized by the store)."""
    out: dict[str, int] = {}
    for frag in ds.get_fragments():
        meta = frag.metadata
        for f in meta.files:
            out[f"data/{f.path}"] = f.file_size_bytes or 0
        if meta.deletion_file is not None:
            out[meta.deletion_file.path(meta.id)] = -1
    return out


def _sizes(store: ObjectStore, paths: Iterable[str]) -> int:
    total = 0
    for p in paths:
        meta = store.head(p)
        total += meta.size if meta else 0
    return total


def plan_retention(table: TableLike, config: RetentionConfig, now: datetime | None = None) -> RetentionPlan:
    """Every version of the table with its verdict under the policy, and the bytes each removal frees
    (files no retained version references; manifests included)."""
    now = now or datetime.now(UTC)
    table = MemWalTable.of(table)
    ds = table.refresh().dataset
    store = table.store
    latest = ds.version
    tags: dict[int, list[str]] = {}
    for name, tag in ds.tags.list().items():
        tags.setdefault(int(tag["version"]), []).append(name)
    window = repair_window(ds)
    listed = sorted(ds.versions(), key=lambda v: int(v["version"]))
    newest = {int(v["version"]) for v in listed[-config.keep_versions:]}
    cutoff = now - timedelta(seconds=config.older_than_s)
    plan = RetentionPlan(store.uri, latest)
    for v in listed:
        version = int(v["version"])
        ts = v["timestamp"].astimezone(UTC)  # pylance gives local time, naive (datetime.fromtimestamp)
        entry = VersionEntry(version, ts.isoformat(timespec="seconds"), sorted(tags.get(version, [])))
        if version == latest:
            entry.reason = "latest"
        elif version in newest:
            entry.reason = f"among the newest {config.keep_versions}"
        elif ts >= cutoff:
            entry.reason = f"newer than {config.older_than_s:g}s"
        elif entry.tags:
            entry.reason = f"tagged {', '.join(entry.tags)}"
        elif version in window:
            entry.reason = "read by the rebase repair of a recent MemWAL index rewrite"
        else:
            entry.remove, entry.reason = True, "older than the policy"
        plan.versions.append(entry)
    if plan.to_remove:
        _size_plan(ds, store, plan)
    return plan


def _size_plan(ds: lance.LanceDataset, store: ObjectStore, plan: RetentionPlan) -> None:
    """Fill in the bytes of each removed version: its manifest, and the files only it references."""
    kept: set[str] = set()
    for version in plan.retained:
        kept.update(_files(ds.checkout_version(version)))
    counted: set[str] = set()
    for entry in plan.versions:
        if not entry.remove:
            continue
        files = {p: s for p, s in _files(ds.checkout_version(entry.version)).items() if p not in kept | counted}
        counted.update(files)
        entry.bytes = sum(s for s in files.values() if s >= 0) + _sizes(store, [p for p, s in files.items() if s < 0])
        entry.bytes += sum(m.size for m in store.list_files("_versions")
                           if m.path.rsplit("/", 1)[-1] in _manifest_names(entry.version))


def _manifest_names(version: int) -> set[str]:
    return {f"{version}.manifest", f"{2**64 - 1 - version}.manifest"}


def retain_versions(table: TableLike, config: RetentionConfig | None = None) -> RetentionSummary:
    """Plan and (unless dry_run or disabled) remove the versions the policy no longer keeps."""
    config = config or RetentionConfig()
    started = time.monotonic()
    table = MemWalTable.of(table)
    plan = plan_retention(table, config)
    summary = RetentionSummary(plan.table_uri, config.dry_run, config.enabled, versions_before=len(plan.versions),
                               versions=plan.versions)
    remove = plan.to_remove if config.enabled else []
    if remove and not config.dry_run:
        log.info("retention: removing table versions %s of %s (policy: older than %gs, keep %d)",
                 remove, plan.table_uri, config.older_than_s, config.keep_versions)
        ds = table.refresh().dataset
        if ds.version in remove:
            raise MemWalError(f"{plan.table_uri}: retention planned to remove the latest version {ds.version}")
        stats = ds.cleanup_old_versions(versions=remove, error_if_tagged_old_versions=False,
                                        delete_unverified=config.delete_unverified)
        summary.bytes_removed = int(stats.bytes_removed)
        left = {int(v["version"]) for v in table.refresh().dataset.versions()}
        summary.versions_removed = [v for v in remove if v not in left]
    elif remove:
        summary.versions_removed, summary.bytes_removed = remove, plan.bytes
    all_versions = [v.version for v in plan.versions]
    remaining = [v for v in all_versions if v not in summary.versions_removed]
    summary.retained_versions = sorted(remaining)
    summary.oldest_retained_version = min(remaining, default=None)
    summary.duration_s = time.monotonic() - started
    verb = "would remove" if config.dry_run else "removed"
    log.info("retention %s %d table versions (%d bytes); oldest retained %s", verb, len(summary.versions_removed),
             summary.bytes_removed, summary.oldest_retained_version)
    return summary
