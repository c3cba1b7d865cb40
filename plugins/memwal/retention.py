"""Version retention: remove base-table versions the table's policy no longer promises (Lance's
`cleanup_old_versions`), so that GC may then free the generations those versions still needed.

Plan, then run (like pyiceberg's ExpireSnapshots): `plan_retention` gives every version its verdict and
why it is kept; `retain_versions` removes exactly the planned versions (Lance's `versions=`) unless
`dry_run`. A version is removed only when all of these hold:
- it is older than `older_than_s` (the time travel the policy promises);
- it is not among the newest `keep_versions` versions, and it is not the latest;
- it carries no tag (tagged versions are always kept, never an error);
- it is not in the window the rebase repair reads (`mem_wal_index.load_index`: the versions between a
  recent MemWAL index rewrite's read version and its commit, whose progress the repair folds in).
A real run plans and removes under the MemWAL index lock: none of our merges, compactions or index
rewrites is then between writing its files and committing them, and the repair window is complete.
Only a dry run sizes what it would free (it opens every version); a real run reports Lance's count.
`_mem_wal/` is never touched here (Lance's cleanup does not look at it); GC owns it.

`delete_unverified` (the CLI's `--delete-unverified` only; the tables file refuses it) lets Lance delete
every file no version references, however young: the files of a write not yet committed look the same.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import lance

from memwal import naming
from memwal.errors import MemWalError
from memwal.maintenance_config import RetentionConfig
from memwal.mem_wal_index import LOOKBACK_VERSIONS, recent_transactions
from memwal.storage import ObjectStore
from memwal.table import MemWalTable, TableLike

__all__ = ["RetentionConfig", "RetentionPlan", "RetentionSummary", "UnverifiedFiles", "VersionEntry",
           "plan_retention", "repair_window", "retain_versions"]

log = logging.getLogger(__name__)

MAX_RANGES = 32  # version ranges a summary's JSON lists per verdict (the counts are always exact)
MAX_SAMPLE = 20  # plan entries a summary's JSON carries
MAX_PATHS = 10  # unreferenced file paths a dry run with delete_unverified names
UNVERIFIED_AGE = timedelta(days=7)  # Lance deletes an unreferenced file younger than this only with delete_unverified


@dataclass
class VersionEntry:
    """One table version in a plan: its age, tags, the bytes only it references (a dry run's estimate),
    the verdict, and why (`kept_by`: latest, newest, age, tag or repair_window; empty when removed)."""

    version: int
    timestamp: str
    tags: list[str] = field(default_factory=list)
    bytes: int = 0
    remove: bool = False
    reason: str = ""
    kept_by: str = ""


@dataclass
class UnverifiedFiles:
    """Files no version references and younger than Lance's 7 days: what `delete_unverified` adds to a
    cleanup. A write not yet committed leaves exactly such files, so they are listed, never guessed."""

    count: int = 0
    bytes: int = 0
    sample: list[str] = field(default_factory=list)


@dataclass
class RetentionPlan:
    table_uri: str
    latest_version: int
    versions: list[VersionEntry] = field(default_factory=list)
    unverified: UnverifiedFiles | None = None

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
    """What a run removed (or a dry run would). `versions_removed`, `retained_versions` and `versions` (the
    plan) hold every version in memory; the JSON (`to_dict`, the XCom) carries counts, version ranges and a
    bounded sample, so its size does not grow with the table's versions."""

    table_uri: str
    dry_run: bool
    enabled: bool = True
    delete_unverified: bool = False
    versions_before: int = 0
    versions_removed: list[int] = field(default_factory=list)
    bytes_removed: int = 0
    oldest_retained_version: int | None = None
    retained_versions: list[int] = field(default_factory=list)
    versions: list[VersionEntry] = field(default_factory=list)
    unverified: UnverifiedFiles | None = None
    lock_wait_s: float = 0.0
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        removed = set(self.versions_removed)
        listed = [v.version for v in self.versions]
        removed_ranges, removed_cut = _ranges(listed, removed, True)
        retained_ranges, retained_cut = _ranges(listed, removed, False)
        kept = [v for v in self.versions if v.kept_by in ("tag", "repair_window")]
        gone = [v for v in reversed(self.versions) if v.version in removed]
        return {
            "job": "retention", "table_uri": self.table_uri, "dry_run": self.dry_run, "enabled": self.enabled,
            "delete_unverified": self.delete_unverified, "versions_before": self.versions_before,
            "num_versions_removed": len(self.versions_removed), "num_versions_retained": len(self.retained_versions),
            "bytes_removed": self.bytes_removed, "oldest_retained_version": self.oldest_retained_version,
            "removed_ranges": removed_ranges, "retained_ranges": retained_ranges,
            "ranges_truncated": removed_cut or retained_cut,
            "retained_by": dict(Counter(v.kept_by or "not_removed" for v in self.versions if v.version not in removed)),
            "versions_sample": [asdict(v) for v in (kept + gone)[:MAX_SAMPLE]],
            "unverified_files": None if self.unverified is None else asdict(self.unverified),
            "lock_wait_s": self.lock_wait_s, "duration_s": self.duration_s,
        }


def _ranges(listed: Sequence[int], removed: set[int], verdict: bool) -> tuple[list[list[int]], bool]:
    """Runs of consecutive listed versions with the given verdict as [first, last], at most MAX_RANGES
    (True when more were cut)."""
    out: list[list[int]] = []
    previous = False
    for version in listed:
        match = (version in removed) == verdict
        if match and previous:
            out[-1][1] = version
        elif match:
            out.append([version, version])
        previous = match
    return out[:MAX_RANGES], len(out) > MAX_RANGES


def repair_window(ds: lance.LanceDataset) -> set[int]:
    """Versions the rebase repair may still read: those between a recent MemWAL index rewrite's read
    version and its own version (empty when no rewrite in the lookback was rebased). A failure to read the
    recent transactions is raised (MemWalError naming the table), never read as an empty window: retention
    would then remove the versions the repair needs."""
    latest = ds.version
    out: set[int] = set()
    try:
        recent = recent_transactions(ds, LOOKBACK_VERSIONS)
    except (OSError, ValueError) as exc:
        raise MemWalError(f"{ds.uri}: retention cannot read the recent transactions that tell which versions "
                          f"the rebase repair reads, so it removes nothing: {str(exc).splitlines()[0]}") from exc
    for offset, txn in enumerate(recent):
        if txn is None or type(txn.operation).__name__ != "CreateIndex":
            continue
        if any(i.name == naming.MEM_WAL_INDEX_NAME for i in txn.operation.new_indices):
            out.update(range(txn.read_version + 1, latest - offset))
    return out


def _files(ds: lance.LanceDataset) -> dict[str, int]:
    """Data and deletion files a version references, with their sizes (deletion files: -1, sized by the
    listing of `_deletions/`)."""
    out: dict[str, int] = {}
    for frag in ds.get_fragments():
        meta = frag.metadata
        for f in meta.files:
            out[f"data/{f.path}"] = f.file_size_bytes or 0
        if meta.deletion_file is not None:
            out[meta.deletion_file.path(meta.id)] = -1
    return out


def _index_dirs(ds: lance.LanceDataset) -> set[str]:
    """The index directories a version references."""
    return {f"_indices/{seg.uuid}" for d in ds.describe_indices() for seg in d.segments}


def plan_retention(table: TableLike, config: RetentionConfig, now: datetime | None = None,
                   size: bool = True) -> RetentionPlan:
    """Every version of the table with its verdict under the policy. With `size` (a dry run), also the
    bytes each removal frees (files no retained version references; manifests included) and, with
    `delete_unverified`, the young unreferenced files Lance would delete too; this opens every version."""
    now = now or datetime.now(UTC)
    table = MemWalTable.of(table)
    ds = table.refresh().dataset
    latest = ds.version
    tags: dict[int, list[str]] = {}
    for name, tag in ds.tags.list().items():
        tags.setdefault(int(tag["version"]), []).append(name)
    window = repair_window(ds)
    listed = sorted(ds.versions(), key=lambda v: int(v["version"]))
    newest = {int(v["version"]) for v in listed[-config.keep_versions:]}
    cutoff = now - timedelta(seconds=config.older_than_s)
    plan = RetentionPlan(table.store.uri, latest)
    for v in listed:
        version = int(v["version"])
        ts = v["timestamp"].astimezone(UTC)  # pylance gives local time, naive (datetime.fromtimestamp)
        entry = VersionEntry(version, ts.isoformat(timespec="seconds"), sorted(tags.get(version, [])))
        if version == latest:
            entry.reason, entry.kept_by = "latest", "latest"
        elif version in newest:
            entry.reason, entry.kept_by = f"among the newest {config.keep_versions}", "newest"
        elif ts >= cutoff:
            entry.reason, entry.kept_by = f"newer than {config.older_than_s:g}s", "age"
        elif entry.tags:
            entry.reason, entry.kept_by = f"tagged {', '.join(entry.tags)}", "tag"
        elif version in window:
            entry.reason = "read by the rebase repair of a recent MemWAL index rewrite"
            entry.kept_by = "repair_window"
        else:
            entry.remove, entry.reason = True, "older than the policy"
        plan.versions.append(entry)
    if size and plan.to_remove:
        referenced = _size_plan(ds, table.store, plan, config.delete_unverified)
        if config.delete_unverified:
            plan.unverified = _unverified(table.store, referenced, now)
    return plan


def _size_plan(ds: lance.LanceDataset, store: ObjectStore, plan: RetentionPlan, indexes: bool) -> set[str]:
    """Fill in the bytes of each removed version: its manifest, and the files only it references. Lists
    `_versions/` and `_deletions/` once and opens each version once. Returns every file (and with
    `indexes`, every index directory) some version references."""
    manifests = {m.path.rsplit("/", 1)[-1]: m.size for m in store.list_files("_versions")}
    deletions = {m.path: m.size for m in store.list_files("_deletions")}
    kept: set[str] = set()
    referenced: set[str] = set()
    for version in plan.retained:
        at = ds.checkout_version(version)
        kept.update(_files(at))
        referenced.update(_index_dirs(at) if indexes else ())
    referenced.update(kept)
    for entry in plan.versions:
        if not entry.remove:
            continue
        at = ds.checkout_version(entry.version)
        referenced.update(_index_dirs(at) if indexes else ())
        for path, size in _files(at).items():
            if path not in referenced:
                referenced.add(path)
                entry.bytes += size if size >= 0 else deletions.get(path, 0)
        entry.bytes += sum(manifests.get(name, 0) for name in _manifest_names(entry.version))
    return referenced


def _unverified(store: ObjectStore, referenced: set[str], now: datetime) -> UnverifiedFiles:
    """The files under data/, _deletions/ and _indices/ that no version references and that are younger
    than Lance's verification age: what delete_unverified adds to the cleanup."""
    out = UnverifiedFiles()
    young = now - UNVERIFIED_AGE
    listed = store.list_files("data") + store.list_files("_deletions") + store.list("_indices")
    for meta in sorted(listed, key=lambda m: m.path):
        owner = meta.path if not meta.path.startswith("_indices/") else "/".join(meta.path.split("/")[:2])
        if owner in referenced or meta.last_modified < young:
            continue
        out.count += 1
        out.bytes += meta.size
        if len(out.sample) < MAX_PATHS:
            out.sample.append(meta.path)
    return out


def _manifest_names(version: int) -> set[str]:
    return {f"{version}.manifest", f"{2**64 - 1 - version}.manifest"}


def retain_versions(table: TableLike, config: RetentionConfig | None = None) -> RetentionSummary:
    """Plan and (unless dry_run) remove the versions the policy no longer keeps; a disabled policy plans
    nothing. A real run plans and removes under the MemWAL index lock (waits for our merges)."""
    config = config or RetentionConfig()
    started = time.monotonic()
    table = MemWalTable.of(table)
    summary = RetentionSummary(table.store.uri, config.dry_run, config.enabled, config.delete_unverified)
    if not config.enabled:
        log.info("retention of %s is disabled (retention.enabled: false): nothing planned or removed", table.uri)
        return summary
    if config.dry_run:
        plan = plan_retention(table, config)
        summary.versions_removed, summary.bytes_removed = plan.to_remove, plan.bytes
        summary.unverified = plan.unverified
    else:
        if config.delete_unverified:
            log.warning("retention of %s with delete_unverified: Lance deletes every file no version references, "
                        "however young; only safe while nothing outside the MemWAL index lock writes the table",
                        table.uri)
        with table.index_lock():
            summary.lock_wait_s = time.monotonic() - started
            plan = plan_retention(table, config, size=False)
            _remove(table, config, plan, summary)
    summary.versions_before, summary.versions = len(plan.versions), plan.versions
    removed = set(summary.versions_removed)
    summary.retained_versions = [v.version for v in plan.versions if v.version not in removed]
    summary.oldest_retained_version = min(summary.retained_versions, default=None)
    summary.duration_s = time.monotonic() - started
    verb = "would remove" if config.dry_run else "removed"
    log.info("retention of %s %s %d table versions (%d bytes); oldest retained %s", table.uri, verb,
             len(summary.versions_removed), summary.bytes_removed, summary.oldest_retained_version)
    return summary


def _remove(table: MemWalTable, config: RetentionConfig, plan: RetentionPlan, summary: RetentionSummary) -> None:
    """Lance's cleanup of exactly the planned versions (under the lock); bytes_removed is Lance's count."""
    remove = plan.to_remove
    if not remove:  # nothing planned (Lance refuses an empty `versions`)
        return
    log.info("retention: removing %d table versions of %s (policy: older than %gs, keep %d)%s",
             len(remove), plan.table_uri, config.older_than_s, config.keep_versions,
             "; deleting unverified files" if config.delete_unverified else "")
    ds = table.dataset
    if ds.version in remove:
        raise MemWalError(f"{plan.table_uri}: retention planned to remove the latest version {ds.version}")
    table.check_lease()  # a destructive step: never after our lease on the lock was lost
    stats = ds.cleanup_old_versions(versions=remove, error_if_tagged_old_versions=False,
                                    delete_unverified=config.delete_unverified)
    summary.bytes_removed = int(stats.bytes_removed)
    left = {int(v["version"]) for v in table.refresh().dataset.versions()}
    summary.versions_removed = [v for v in remove if v not in left]
