"""The due rules (memwal.due_rules) on figures and listings made by hand: each threshold's edge, what keeps a
job from being due, and the policy's checks. No table is read."""

from __future__ import annotations

import pytest

from memwal.due_rules import ProbePolicy, decide
from memwal.errors import BadInputError
from memwal.job_config import GcConfig, JobOptions
from memwal.maintenance_config import RetentionConfig
from memwal.probe_listing import GenDir, Listing

R = "6f1c3a52-0d4e-4a57-9b1e-6f0c2b9d1e11"
NOW = 1_000_000.0


def _facts(flushed=((1, "aaaaaaaa_gen_1"), (2, "bbbbbbbb_gen_2")), merged=0, safe=0, current=3, **extra) -> dict:
    """One region; merge figures as plan_merge gives them; no index, compaction not due, a snapshot taken
    at NOW - 100 s recording the region at manifest version 3."""
    pending = [g for g, _ in flushed if g > merged]
    facts = {
        "not_memwal": False,
        "regions": {R: {"merged": merged, "current_generation": current, "index_lag": 0, "safe_generation": safe,
                        "flushed": [list(f) for f in flushed], "limited_by": "merged_generations"}},
        "merge": {"facts": {"generations": len(pending), "backlog_bytes": 100 * len(pending),
                            "region_batches": 1 if pending else 0}},
        "catchup": {"facts": {"indexes": 0, "rows_to_index": 0}, "over_segment_limit": {}},
        "compaction": {"executor_work": False, "reason": "compaction is not due", "facts": {}},
        "tags": [], "snapshot": {"ts_millis": int((NOW - 100) * 1000), "regions": {R: 3}},
    }
    facts.update(extra)
    return facts


def _listing(manifests=(1, 2, 3), gen_dirs=None, versions=((1, NOW - 900), (2, NOW - 800)), staging=None):
    dirs = gen_dirs if gen_dirs is not None else {
        "aaaaaaaa_gen_1": GenDir(oldest=NOW - 600, newest=NOW - 600, bytes=10, data_bytes=5),
        "bbbbbbbb_gen_2": GenDir(oldest=NOW - 300, newest=NOW - 300, bytes=20, data_bytes=9)}
    return Listing(list(versions), {R: list(manifests)}, {R: dirs}, dict(staging or {}))


def _jobs(facts, listing, policy=None, now=NOW) -> dict:
    return {d.job: d for d in decide(facts, listing, policy or ProbePolicy(), now)}


def test_merge_from_the_first_unmerged_generation_by_default_and_from_thresholds_when_set():
    merge = _jobs(_facts(), _listing())["merge"]
    assert merge.reason == "2 unmerged generation(s) (200 bytes in 1 region(s))"
    assert merge.figures == {"generations": 2, "bytes": 200, "regions": 1, "oldest_unmerged_age_s": 600.0}
    assert "merge" not in _jobs(_facts(merged=2), _listing())
    waiting = ProbePolicy(merge_min_generations=3)
    assert "merge" not in _jobs(_facts(), _listing(), waiting)
    assert _jobs(_facts(), _listing(), ProbePolicy(merge_min_generations=2))["merge"].reason.startswith(
        "2 unmerged generation(s) >= 2 ")
    by_bytes = ProbePolicy(merge_min_generations=3, merge_min_bytes=200)
    assert _jobs(_facts(), _listing(), by_bytes)["merge"].reason.startswith("200 unmerged bytes >= 200 ")
    by_age = ProbePolicy(merge_min_generations=3, merge_max_age_s=600)
    assert _jobs(_facts(), _listing(), by_age)["merge"].reason.startswith(
        "oldest unmerged generation 600s old >= 600s")
    assert "merge" not in _jobs(_facts(), _listing(), by_age, now=NOW - 1), "599 s old"


def test_snapshot_when_never_written_or_old_with_a_region_moved():
    assert _jobs(_facts(snapshot={"ts_millis": 0, "regions": None}), _listing())["snapshot"].reason == (
        "no MemWAL index snapshot was ever written (1 regions)")
    assert "snapshot" not in _jobs(_facts(), _listing(), now=NOW + 7200), "old, nothing moved"
    moved = _jobs(_facts(), _listing(manifests=(1, 2, 3, 4)), now=NOW + 3500)["snapshot"]
    assert moved.reason == "snapshot 3600s old >= 3600s and 1 region manifest(s) moved since"
    assert "snapshot" not in _jobs(_facts(), _listing(manifests=(1, 2, 3, 4)), now=NOW + 3400), "young"
    external = _facts(snapshot={"ts_millis": int((NOW - 100) * 1000), "regions": None})
    assert "snapshot" in _jobs(external, _listing(), now=NOW + 3600), "an external snapshot counts as moved"
    assert "snapshot" not in _jobs(_facts(), _listing(manifests=()), now=NOW + 7200), "no region"
    never_by_age = ProbePolicy(snapshot_max_age_s=None)
    assert "snapshot" not in _jobs(_facts(), _listing(manifests=(1, 2, 3, 4)), never_by_age, now=NOW + 10**6)


def test_retention_keeps_the_latest_the_newest_the_young_and_the_tagged():
    versions = [(v, NOW - 1000 + v) for v in range(1, 8)]  # 7 versions, 1 s apart
    policy = ProbePolicy(options=JobOptions(retention=RetentionConfig(older_than_s=995, keep_versions=2)))
    due = _jobs(_facts(), _listing(versions=versions), policy)["retention"]
    assert due.figures == {"versions": 7, "removable": 4, "oldest": 1}, "1-4; 5 is 995 s old; 6, 7 the newest"
    assert _jobs(_facts(tags=[1, 3]), _listing(versions=versions), policy)["retention"].figures["removable"] == 2
    young = ProbePolicy(options=JobOptions(retention=RetentionConfig(older_than_s=998, keep_versions=2)))
    assert _jobs(_facts(), _listing(versions=versions), young)["retention"].figures["removable"] == 1
    off = ProbePolicy(options=JobOptions(retention=RetentionConfig(older_than_s=0, enabled=False)))
    assert "retention" not in _jobs(_facts(), _listing(versions=versions), off)


def test_gc_generations_manifests_failed_flushes_and_staging():
    gc = _jobs(_facts(merged=2, safe=1), _listing())["gc"]
    assert gc.figures == {"generations": 1, "manifest_versions": 0, "failed_flushes": 0, "staging": 0, "bytes": 10}
    assert gc.reason == "collectable: 1 generation(s) (10 bytes)"
    assert "gc" not in _jobs(_facts(merged=2, safe=1), _listing(),
                             ProbePolicy(options=JobOptions(gc=GcConfig(enabled=False))))
    few = ProbePolicy(options=JobOptions(gc=GcConfig(keep_manifest_versions=2)))
    assert _jobs(_facts(), _listing(), few)["gc"].figures["manifest_versions"] == 1
    assert _jobs(_facts(merged=2, safe=1), _listing(), few)["gc"].figures["manifest_versions"] == 2, (
        "removing generations commits one more manifest version: one fewer of the old ones is kept")
    dirs = {**_listing().gen_dirs[R],
            "cccccccc_gen_2": GenDir(oldest=NOW - 4000, newest=NOW - 4000, bytes=7),  # unlisted, old
            "dddddddd_gen_2": GenDir(oldest=NOW - 10, newest=NOW - 10, bytes=7),  # unlisted, young
            "eeeeeeee_gen_3": GenDir(oldest=NOW - 9000, newest=NOW - 9000, bytes=7)}  # a flush in flight
    failed = _jobs(_facts(), _listing(gen_dirs=dirs))["gc"]
    assert failed.figures["failed_flushes"] == 1 and failed.figures["bytes"] == 7
    staging = _jobs(_facts(), _listing(staging={"m1": NOW - 3600, "m2": NOW - 10}))["gc"]
    assert staging.reason == "collectable: 1 abandoned staging dir(s) (0 bytes)"


def test_catchup_compaction_order_and_a_table_without_memwal():
    facts = _facts(catchup={"facts": {"indexes": 1, "rows_to_index": 12}, "over_segment_limit": {"v": [5, 4]}},
                   compaction={"executor_work": True, "reason": "compaction is due: 20 small fragments >= 16",
                               "facts": {"small_fragments": 20}})
    facts["regions"][R]["index_lag"] = 2
    found = decide(facts, _listing(manifests=(1, 2, 3, 4)), ProbePolicy(), NOW + 7200)
    assert [d.job for d in found] == ["merge", "catchup", "compaction", "snapshot"]
    assert found[1].reason == "an index lags the merges by 2 generation(s); 12 row(s) to index; index v has 5 " \
                              "segments > 4"
    assert found[2].reason == "compaction is due: 20 small fragments >= 16"
    assert decide({"not_memwal": True}, _listing(), ProbePolicy(), NOW) == []


def test_policy_values_are_checked_naming_the_field():
    with pytest.raises(BadInputError, match="probe policy merge_min_generations: 0 is not >= 1"):
        ProbePolicy(merge_min_generations=0)
    with pytest.raises(BadInputError, match="probe policy snapshot_max_age_s: -1 is negative"):
        ProbePolicy(snapshot_max_age_s=-1)
    with pytest.raises(BadInputError, match="probe policy options"):
        ProbePolicy(options={"gc": {}})
    assert ProbePolicy().key() == ProbePolicy().key() != ProbePolicy(merge_min_generations=2).key()
