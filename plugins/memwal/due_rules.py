"""When each maintenance job is due, and why: the rules of the due-work probe (`memwal.probe`), with no I/O.

The inputs are the figures a table's last change gave (`facts`: the jobs' plans, each region's manifest and
progress, the snapshot's record, the tags; `memwal.probe` reads them), the fresh listings
(`memwal.probe_listing.Listing`) and the clock, so an unchanged table is decided again without a read.

"Due" is what the job would do now:
- merge: unmerged generations (`plan_merge`) at or above the policy's `merge_min_generations` (default 1:
  anything unmerged), or `merge_min_bytes`, or the oldest older than `merge_max_age_s`;
- catch-up: a maintained index lags the merges (index_catchup below merged_generations, coverage as
  `memwal.index_coverage` reads it), has rows to index (`plan_catchup`), or has more segments than the
  index policy allows (catch-up folds them);
- compaction: `plan_compaction` says due (the table's compaction rules; disabled: never);
- retention: a version not the latest, not among the newest `keep_versions`, older than `older_than_s` and
  untagged (the listing's time; the rebase repair window that the job also keeps is not read: a version
  held only by it reads as due until 16 more versions pass);
- snapshot: regions exist and no snapshot was ever written, or the snapshot is older than
  `snapshot_max_age_s` and some region manifest moved since it (an external snapshot counts as moved);
- GC (unless `gc.enabled: false`): generations at or below GC's safe generation (`memwal.gc.safe_generation`
  over every retained version), region manifest versions over `keep_manifest_versions`, unlisted generation
  directories past the grace period (failed flushes), abandoned merge staging. WAL entries go with their
  generations; superseded lock objects are left to GC's next run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memwal import naming
from memwal.errors import BadInputError
from memwal.job_config import JobOptions
from memwal.option_values import count, optional, seconds
from memwal.probe_listing import GenDir, Listing

__all__ = ["JOB_ORDER", "DueJob", "ProbePolicy", "decide"]

JOB_ORDER = ("merge", "catchup", "compaction", "retention", "snapshot", "gc")  # the safe order


@dataclass(frozen=True)
class ProbePolicy:
    """What makes a job due for one table: the jobs' own options (`JobOptions`: compaction and retention rules,
    the index policy, GC's settings) plus the probe's own knobs, for which no job option existed.

    merge_min_generations: merge is due from this many unmerged generations (over every region; 1: anything
    unmerged); merge_min_bytes / merge_max_age_s: or from this many unmerged bytes, or once the oldest
    unmerged generation is this old (None: not checked). snapshot_max_age_s: a snapshot is refreshed once
    older than this if a region manifest moved since (None: only a table that never had one)."""

    options: JobOptions = field(default_factory=JobOptions)
    merge_min_generations: int = 1
    merge_min_bytes: int | None = None
    merge_max_age_s: float | None = None
    snapshot_max_age_s: float | None = 3600.0

    def __post_init__(self) -> None:
        checks = {"merge_min_generations": count, "merge_min_bytes": optional(count),
                  "merge_max_age_s": optional(seconds), "snapshot_max_age_s": optional(seconds)}
        for name, check in checks.items():
            try:
                check(getattr(self, name))
            except ValueError as exc:
                raise BadInputError(f"probe policy {name}: {exc}") from None
        if not isinstance(self.options, JobOptions):
            raise BadInputError(f"probe policy options: {self.options!r} is not a JobOptions")

    def key(self) -> str:
        """A short fingerprint: a state read under another policy is read again."""
        return hashlib.sha256(repr(self).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class DueJob:
    """One due job: why (one line) and the figures behind it."""

    job: str
    reason: str
    figures: dict[str, Any] = field(default_factory=dict)


def _merge_due(facts: Mapping[str, Any], listing: Listing, policy: ProbePolicy, now: float) -> DueJob | None:
    plan = facts["merge"]["facts"]
    generations, backlog = plan["generations"], plan["backlog_bytes"]
    oldest = min((listing.gen_dirs.get(rid, {}).get(path, GenDir()).oldest
                  for rid, r in facts["regions"].items() for gen, path in r["flushed"] if gen > r["merged"]),
                 default=float("inf"))
    age = max(0.0, now - oldest) if oldest != float("inf") else None
    figures = {"generations": generations, "bytes": backlog, "regions": plan["region_batches"],
               "oldest_unmerged_age_s": None if age is None else round(age, 1)}
    if not generations:
        return None
    reasons = []
    if generations >= policy.merge_min_generations:
        at_least = policy.merge_min_generations
        reasons.append(f"{generations} unmerged generation(s)" + (f" >= {at_least}" if at_least > 1 else ""))
    if policy.merge_min_bytes is not None and backlog >= policy.merge_min_bytes:
        reasons.append(f"{backlog} unmerged bytes >= {policy.merge_min_bytes}")
    if policy.merge_max_age_s is not None and age is not None and age >= policy.merge_max_age_s:
        reasons.append(f"oldest unmerged generation {age:.0f}s old >= {policy.merge_max_age_s:g}s")
    if not reasons:
        return None
    return DueJob("merge", "; ".join(reasons) + f" ({backlog} bytes in {plan['region_batches']} region(s))", figures)


def _catchup_due(facts: Mapping[str, Any]) -> DueJob | None:
    plan = facts["catchup"]
    lag = max((r["index_lag"] for r in facts["regions"].values()), default=0)
    rows = plan["facts"]["rows_to_index"]
    over = plan["over_segment_limit"]
    reasons = []
    if lag:
        reasons.append(f"an index lags the merges by {lag} generation(s)")
    if rows:
        reasons.append(f"{rows} row(s) to index")
    reasons += [f"index {name} has {n} segments > {limit}" for name, (n, limit) in over.items()]
    if not reasons or not plan["facts"]["indexes"]:
        return None
    return DueJob("catchup", "; ".join(reasons), {"index_lag_generations": lag, "rows_to_index": rows,
                                                  "indexes": plan["facts"]["indexes"], "over_segment_limit": over})


def _compaction_due(facts: Mapping[str, Any]) -> DueJob | None:
    plan = facts["compaction"]
    return DueJob("compaction", plan["reason"], plan["facts"]) if plan["executor_work"] else None


def _retention_due(facts: Mapping[str, Any], listing: Listing, policy: ProbePolicy, now: float) -> DueJob | None:
    config = policy.options.retention
    if not config.enabled or not listing.versions:
        return None
    latest = listing.versions[-1][0]
    newest = {v for v, _ in listing.versions[-config.keep_versions:]}
    tagged = set(facts.get("tags") or ())
    removable = [v for v, ts in listing.versions if v != latest and v not in newest and v not in tagged
                 and ts < now - config.older_than_s]
    if not removable:
        return None
    return DueJob("retention", f"{len(removable)} table version(s) older than {config.older_than_s:g}s beyond "
                  f"the newest {config.keep_versions}",
                  {"versions": len(listing.versions), "removable": len(removable), "oldest": removable[0]})


def _snapshot_due(facts: Mapping[str, Any], listing: Listing, policy: ProbePolicy, now: float) -> DueJob | None:
    current = listing.region_versions
    if not current:
        return None
    ts = facts["snapshot"]["ts_millis"]
    if not ts:
        return DueJob("snapshot", f"no MemWAL index snapshot was ever written ({len(current)} regions)",
                      {"regions": len(current), "snapshot_age_s": None})
    age = max(0.0, now - ts / 1000.0)
    recorded = facts["snapshot"]["regions"]
    moved = len(current) if recorded is None else sum(recorded.get(r) != v for r, v in current.items())
    figures = {"regions": len(current), "snapshot_age_s": round(age, 1), "regions_moved": moved}
    if policy.snapshot_max_age_s is None or age < policy.snapshot_max_age_s or not moved:
        return None
    return DueJob("snapshot", f"snapshot {age:.0f}s old >= {policy.snapshot_max_age_s:g}s and {moved} region "
                  "manifest(s) moved since", figures)


def _gc_due(facts: Mapping[str, Any], listing: Listing, policy: ProbePolicy, now: float) -> DueJob | None:
    config = policy.options.gc
    if not config.enabled:
        return None
    figures = {"generations": 0, "manifest_versions": 0, "failed_flushes": 0, "staging": 0, "bytes": 0}
    for rid, r in facts["regions"].items():
        dirs = listing.gen_dirs.get(rid, {})
        listed = {path for _, path in r["flushed"]}
        collectable = [path for gen, path in r["flushed"] if gen <= r["safe_generation"]]
        figures["generations"] += len(collectable)
        figures["bytes"] += sum(dirs[p].bytes for p in collectable if p in dirs)
        for name, d in dirs.items():
            gen = naming.parse_generation_dir_name(name) or 0
            if name in listed or gen >= r["current_generation"]:
                continue
            if gen <= r["safe_generation"] or now - d.newest >= config.grace_period_s:
                figures["failed_flushes"] += 1
                figures["bytes"] += d.bytes
        keep = max(config.keep_manifest_versions - (1 if collectable else 0), 1)
        figures["manifest_versions"] += max(0, len(listing.manifests.get(rid, ())) - keep)
    figures["staging"] = sum(now - newest >= config.grace_period_s for newest in listing.staging.values())
    parts = [f"{figures[k]} {label}" for k, label in (
        ("generations", "generation(s)"), ("manifest_versions", "region manifest version(s)"),
        ("failed_flushes", "failed flush(es)"), ("staging", "abandoned staging dir(s)")) if figures[k]]
    if not parts:
        return None
    return DueJob("gc", "collectable: " + ", ".join(parts) + f" ({figures['bytes']} bytes)", figures)


def decide(facts: Mapping[str, Any], listing: Listing, policy: ProbePolicy, now: float) -> list[DueJob]:
    """The due jobs in the safe order (JOB_ORDER), from the facts, the fresh listings and the time."""
    if facts.get("not_memwal"):
        return []
    found = [_merge_due(facts, listing, policy, now), _catchup_due(facts), _compaction_due(facts),
             _retention_due(facts, listing, policy, now), _snapshot_due(facts, listing, policy, now),
             _gc_due(facts, listing, policy, now)]
    return [d for d in found if d is not None]
