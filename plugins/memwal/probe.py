"""The due-work probe: for a table and its policy, which maintenance jobs are due now and why, from metadata
only, cheaply enough to sweep a fleet of tables every few minutes.

Every probe makes two object-store requests, whatever happened:
1. one LIST of `_versions/` (non-recursive): the base table's versions, the latest among them, and each
   manifest's last-modified time (what retention ages); one more per 1,000 versions kept;
2. one recursive LIST of `_mem_wal/`: every region's manifest versions (region manifests change without the
   base version changing: flushes, GC's prunes), the generation directories with their files' sizes and
   times (merge backlog age, failed flushes), merge staging. One page holds 1,000 objects, about 80
   unmerged generations' files on top of the manifests and WAL entries: a table with a larger `_mem_wal/`
   costs one more LIST per 1,000 objects.
When the key of the two listings (the base versions, every region's newest manifest version) and the policy
are those of the previous probe (`ProbeState`), nothing else is read: the figures that only a change can move
come from the state, the ones that time or the listings move (ages, failed flushes, staging, manifest
versions over the kept count, retention's candidates) are recomputed from the fresh listings.

A changed table is read once more: Lance opens it (a LIST and a GET), the MemWAL index (a GET of the
manifest; read as committed, not raised over a rebased rewrite: a probe then sees less progress, never
more), each region's newest manifest (a GET each), the jobs' own planners (`memwal.job_plans`: merge's loads
each region's manifest and lists each unmerged generation's data), each retained base version's MemWAL
progress not read before (a GET each, kept in the state: versions never change) and, with more versions than
retention keeps, the tags (a LIST). bench/README.md has the counts measured.

Due jobs come in the safe order merge -> catch-up -> compaction -> retention -> snapshot -> GC, each with its
reason and the figures behind it; the rules are in `memwal.due_rules`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from memwal.due_rules import JOB_ORDER, DueJob, ProbePolicy, decide
from memwal.errors import BadInputError, MemWalError, MemWalNotInitializedError, RegionNotFoundError, one_line
from memwal.mem_wal_index import read_details_at
from memwal.option_values import count
from memwal.probe_listing import Listing, read_listings
from memwal.storage import ObjectStore
from memwal.table import MemWalTable

__all__ = ["JOB_ORDER", "DueJob", "ProbeEntry", "ProbePolicy", "ProbeResult", "ProbeState", "next_states",
           "probe_table", "probe_tables"]

log = logging.getLogger(__name__)

MAX_WORKERS = 16  # tables probed at once by default: each probe is a few requests in a row


@dataclass(frozen=True)
class ProbeState:
    """What one probe hands to the next: the key of the listings (base versions, each region's newest
    manifest version), the policy's fingerprint, the figures read when the table last changed, and the
    answer. JSON-ready (`to_dict` / `from_dict`) so a scheduler can keep it between runs."""

    table_uri: str
    base_versions: tuple[int, ...]
    region_versions: Mapping[str, int]
    policy_key: str
    facts: Mapping[str, Any]
    due: tuple[str, ...] = ()
    probed_at: float = 0.0

    @property
    def base_version(self) -> int | None:
        return self.base_versions[-1] if self.base_versions else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "base_versions": list(self.base_versions), "due": list(self.due),
                "region_versions": dict(self.region_versions)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProbeState:
        return cls(str(data["table_uri"]), tuple(int(v) for v in data["base_versions"]),
                   {str(k): int(v) for k, v in data["region_versions"].items()}, str(data["policy_key"]),
                   dict(data["facts"]), tuple(data.get("due") or ()), float(data.get("probed_at") or 0.0))


@dataclass
class ProbeResult:
    """The answer for one table (or one directory under a root that is not a MemWAL table).

    status: ok | error (`error` names the table and the object; the due jobs of what could be read are still
    listed) | not_memwal (a Lance table without a MemWAL index) | not_a_table (no Lance table there).
    changed: whether anything was read beyond the two listings (None: the first probe)."""

    table_uri: str
    status: str
    due: list[DueJob] = field(default_factory=list)
    changed: bool | None = None
    error: str | None = None
    state: ProbeState | None = None
    name: str | None = None
    root: str | None = None
    probed_at: float = 0.0
    duration_s: float = 0.0

    @property
    def jobs(self) -> list[str]:
        return [d.job for d in self.due]

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "state"}
        out["duration_s"] = round(self.duration_s, 4)
        return out


@dataclass(frozen=True)
class ProbeEntry:
    """One entry of a sweep: a table, or a root (a directory, an S3 prefix or a LanceDB database) whose every
    Lance table is probed with this entry's policy. kind: table | root | auto (a Lance table at the URI is a
    table, anything else a root)."""

    uri: str
    storage_options: Mapping[str, str] | None = None
    policy: ProbePolicy = field(default_factory=ProbePolicy)
    name: str | None = None
    kind: str = "auto"

    def __post_init__(self) -> None:
        if self.kind not in ("table", "root", "auto"):
            raise BadInputError(f"probe entry {self.uri}: kind {self.kind!r} is not table, root or auto")


# --- what only a change can move (read when the key moved) -----------------------------------------------


def _snapshot_regions(table_uri: str, inline: bytes | None) -> dict[str, int] | None:
    """Region -> manifest version recorded in an inline snapshot; None when that is not known here (an external
    snapshot, read by the job only, or bytes this library cannot read: every region then counts as moved)."""
    if inline is None:
        return None
    import pyarrow as pa

    from memwal.snapshot import decode_snapshot

    try:
        rows = decode_snapshot(inline).select(["region_id", "version"]).to_pylist()
        return {str(uuid.UUID(bytes=r["region_id"])): int(r["version"]) for r in rows}
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
        log.warning("probe: %s: the inline region snapshot cannot be read (%s); a refresh rewrites it",
                    table_uri, one_line(exc))
        return None


def _retained_progress(table: MemWalTable, versions: Sequence[int],
                       cached: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """merged_generations as of every listed base version (GC's `retained` input): the latest from the
    loaded index, the others from the state when read before (versions never change), else one GET each."""
    out: dict[str, dict[str, int]] = {}
    for version in versions:
        key = str(version)
        if version == table.version:
            out[key] = dict(table.details.merged_generations)
        elif key in cached:
            out[key] = dict(cached[key])
        else:
            try:
                details = read_details_at(table.store, version)
            except FileNotFoundError:
                continue  # removed by retention since the listing
            out[key] = dict(details.merged_generations) if details else {}
    return out


def _read_facts(table: MemWalTable, listing: Listing, policy: ProbePolicy,
                previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """The figures only a change can move, JSON-ready; a region whose manifest cannot be read is in
    `region_errors` (naming the object) and the rest is read on."""
    from memwal.gc import safe_generation
    from memwal.index_coverage import with_coverage
    from memwal.index_segments import segment_counts
    from memwal.job_plans import plan_catchup, plan_compaction, plan_merge
    from memwal.mem_wal_index import index_of
    from memwal.region_manifest import load_latest_manifest, load_manifest

    ds = table.dataset
    try:
        table.adopt(ds, index_of(ds, table.store, monotone=False))
    except MemWalNotInitializedError:
        return {"not_memwal": True, "table_version": ds.version}
    options = policy.options
    indexes = table.maintained_indexes()
    index = with_coverage(table.index, ds, indexes)
    progress = _retained_progress(table, [v for v, _ in listing.versions], (previous or {}).get("progress", {}))
    regions: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for rid, version in listing.region_versions.items():
        try:
            try:
                m = load_manifest(table.store, rid, version)
            except RegionNotFoundError:  # pruned since the listing: a newer one exists
                m = load_latest_manifest(table.store, rid)
        except (MemWalError, OSError) as exc:
            errors[rid] = f"table {table.uri}: region {rid}: {one_line(exc)}"
            continue
        merged = index.details.merged_generation(rid)
        lag = 0
        for name in indexes:
            per_region = index.details.index_catchup.get(name)
            lag = max(lag, merged - (merged if per_region is None else per_region.get(rid, 0)))
        safe, limited_by = safe_generation(index, rid, indexes, {int(v): p for v, p in progress.items()})
        regions[rid] = {"merged": merged, "current_generation": m.current_generation, "index_lag": lag,
                        "flushed": sorted([fg.generation, fg.path] for fg in m.flushed_generations),
                        "safe_generation": safe, "limited_by": limited_by}
    segments = segment_counts(ds)
    over = {name: [n, options.index_policy.limit(name)] for name, n in sorted(segments.items())
            if name in indexes and options.index_policy.limit(name) is not None
            and n > options.index_policy.limit(name)}
    tags: list[int] = []
    if len(listing.versions) > options.retention.keep_versions:
        tags = sorted({int(t["version"]) for t in ds.tags.list().values()})
    details = index.details
    return {
        "not_memwal": False, "table_version": ds.version, "regions": regions, "region_errors": errors,
        "merge": plan_merge(table, options, None).to_dict(),
        "catchup": {**plan_catchup(table, options, None).to_dict(), "over_segment_limit": over},
        "compaction": plan_compaction(table, options, None).to_dict(),
        "tags": tags, "progress": progress,
        "snapshot": {"ts_millis": details.snapshot_ts_millis,
                     "regions": _snapshot_regions(table.uri, details.inline_snapshots)},
    }


# --- one table, many tables ------------------------------------------------------------------------------


def probe_table(table_or_uri: MemWalTable | str, policy: ProbePolicy | None = None,
                previous: ProbeState | None = None, *, storage_options: Mapping[str, str] | None = None,
                now: float | None = None) -> ProbeResult:
    """Which jobs are due on the table now and why (the requests: the module docstring; the rules:
    `memwal.due_rules`), and the state to pass next time. A table that cannot be probed (storage error,
    corrupt manifest) is a result with status `error` naming the table and the object, not an exception: a
    sweep goes on with the others."""
    started = time.monotonic()
    policy = policy or ProbePolicy()
    if isinstance(table_or_uri, MemWalTable):
        uri, options = table_or_uri.uri, table_or_uri.storage_options
    else:
        uri, options = str(table_or_uri), dict(storage_options or {}) or None
    now = time.time() if now is None else now
    result = ProbeResult(uri, "ok", probed_at=now)
    try:
        store = ObjectStore(uri, options)
        result.table_uri = store.uri
        listing = read_listings(store)
        if not listing.versions:
            result.status, result.error = "not_a_table", f"{store.uri}: no Lance table there (no _versions/)"
            return result
        key = (tuple(v for v, _ in listing.versions), listing.region_versions, policy.key())
        usable = (previous is not None and previous.table_uri == store.uri
                  and not previous.facts.get("region_errors")  # a table with an unreadable region: read again
                  and (previous.base_versions, dict(previous.region_versions), previous.policy_key) == key)
        result.changed = None if previous is None else not usable
        facts = dict(previous.facts) if usable else _read_facts(
            MemWalTable(store.uri, options), listing, policy, previous.facts if previous else None)
        if facts.get("not_memwal"):
            result.status = "not_memwal"
            result.error = f"{store.uri}: a Lance table without a MemWAL index (not maintained here)"
        result.due = decide(facts, listing, policy, now)
        errors = facts.get("region_errors") or {}
        if errors:
            result.status, result.error = "error", "; ".join(errors[r] for r in sorted(errors))
            log.warning("probe: %s", result.error)
        result.state = ProbeState(store.uri, key[0], key[1], key[2], facts, tuple(result.jobs), now)
    except Exception as exc:  # one table's failure (storage, permissions, Lance) is its result
        result.status, result.error = "error", f"table {uri}: {one_line(exc)}"
        log.warning("probe: %s", result.error)
    finally:
        result.duration_s = time.monotonic() - started
    return result


def next_states(results: Iterable[ProbeResult]) -> dict[str, ProbeState]:
    """The states to pass to the next sweep: one per table probed (a table no longer found has none)."""
    return {r.table_uri: r.state for r in results if r.state is not None}


def probe_tables(entries: Iterable[ProbeEntry | str], states: Mapping[str, ProbeState] | None = None,
                 max_workers: int = MAX_WORKERS, *, now: float | None = None) -> list[ProbeResult]:
    """Probe every table of the entries (a root's tables found anew each time, `memwal.table_roots`),
    at most `max_workers` at once. One result per table and per directory under a root that is not a
    table; a root that cannot be listed is one `error` result naming it. Nothing raised stops the others."""
    from memwal.table_roots import list_root

    states = dict(states or {})
    count(max_workers)
    now = time.time() if now is None else now
    targets: dict[str, tuple[ProbeEntry, str | None]] = {}  # table URI -> (its entry, its root); first wins
    out: list[ProbeResult] = []
    for entry in entries:
        entry = entry if isinstance(entry, ProbeEntry) else ProbeEntry(str(entry))
        options = dict(entry.storage_options or {}) or None
        try:  # auto: one listing tells a table (it holds _versions/) from a root
            uri = ObjectStore(entry.uri, options).uri
            if entry.kind == "table" or (entry.kind == "auto" and uri in states):  # a table probed before
                targets.setdefault(uri, (entry, None))
                continue
            found = list_root(entry.uri, options, known=states.keys(), max_workers=max_workers)
        except Exception as exc:  # a bad URI or a root that cannot be listed is reported, the others go on
            out.append(ProbeResult(entry.uri, "error", error=one_line(exc), name=entry.name, probed_at=now))
            log.error("probe: %s", one_line(exc))
            continue
        if found.tables == [found.root]:  # the root is itself a table
            targets.setdefault(found.root, (entry, None))
            continue
        for uri in found.tables:
            targets.setdefault(uri, (entry, found.root))
        out += [ProbeResult(uri, "not_a_table", error=f"{uri}: {why}", root=found.root, probed_at=now)
                for uri, why in found.other]

    def one(target: tuple[str, tuple[ProbeEntry, str | None]]) -> ProbeResult:
        uri, (entry, root) = target
        result = probe_table(uri, entry.policy, states.get(uri), storage_options=entry.storage_options, now=now)
        result.name, result.root = entry.name if root is None else None, root
        return result

    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(targets)))) as pool:
        probed = list(pool.map(one, targets.items()))
    log.info("probe: %d table(s), %d with due work, %d failed", len(probed), sum(bool(r.due) for r in probed),
             sum(r.status == "error" for r in probed))
    return probed + out
