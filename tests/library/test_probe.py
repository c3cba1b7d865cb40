"""The due-work probe (memwal.probe): what is due and why per job kind, the unchanged table's two requests
(counted on the S3 endpoint), state kept between probes, a sweep over many tables with one failing, and
`memwal probe`."""

from __future__ import annotations

import json
import time

import pytest

from memwal.catchup import catchup_table
from memwal.cli import main
from memwal.errors import BadInputError
from memwal.gc import gc_table
from memwal.job_config import GcConfig, JobOptions
from memwal.maintenance_config import CompactionConfig, IndexPolicy, RetentionConfig
from memwal.merge import merge_table
from memwal.probe import JOB_ORDER, ProbeEntry, ProbePolicy, ProbeState, next_states, probe_table, probe_tables
from memwal.region_manifest import list_regions
from memwal.retention import retain_versions
from memwal.snapshot import refresh_snapshot

from support.maintenance import build_table, write_generations
from support.tables import open_base

LATER = 10.0  # seconds after the writes: "now" for the time rules, so no assertion waits on the clock


def _policy(**options) -> ProbePolicy:
    return ProbePolicy(options=JobOptions(**options))


def _due(result) -> dict[str, str]:
    assert result.status == "ok", result.error
    return {d.job: d.reason for d in result.due}


def test_unchanged_table_costs_two_requests_on_s3(s3_location):
    """Probing again a table that did not change: two LISTs (the base versions, `_mem_wal/`), counted on the S3
    endpoint, and the same answer. A flush (a region manifest moves, the base version does not) is seen."""
    from support.locations import s3_options
    from support.s3_requests import counting_proxy

    loc = s3_location
    regions = build_table(loc, regions=2, generations=2)
    with counting_proxy(loc.storage_options["aws_endpoint"]) as proxy:
        via_proxy = {**loc.storage_options, "aws_endpoint": proxy.endpoint}
        assert s3_options(proxy.endpoint).keys() <= via_proxy.keys()
        cold = probe_table(loc.uri, storage_options=via_proxy)
        cold_requests = sum(proxy.counts.values())
        proxy.reset()
        again = probe_table(loc.uri, previous=cold.state, storage_options=via_proxy)
        unchanged = dict(proxy.counts)
        paths = list(proxy.paths)
        write_generations(loc, regions[0], [([7001], "late", [])])
        proxy.reset()
        after_flush = probe_table(loc.uri, previous=again.state, storage_options=via_proxy)
        changed_requests = sum(proxy.counts.values())
    print("requests: cold", cold_requests, "unchanged", unchanged, "after a flush", changed_requests)
    assert unchanged == {"LIST": 2}, paths
    assert again.changed is False and again.jobs == cold.jobs == ["merge", "snapshot"]
    assert [d.reason for d in again.due] == [d.reason for d in cold.due], "the same figures (the ages aside)"
    assert after_flush.changed is True and after_flush.state.base_version == cold.state.base_version
    assert after_flush.due[0].figures["generations"] == 5 and cold.due[0].figures["generations"] == 4
    assert cold_requests > 2 and changed_requests > 2


def test_merge_due_on_flushed_generations_then_not_after_the_merge(local_location):
    loc = local_location
    build_table(loc, regions=2, generations=3)
    first = probe_table(loc.uri)
    merge = first.due[0]
    assert merge.job == "merge" and merge.figures["generations"] == 6 and merge.figures["regions"] == 2
    assert merge.figures["bytes"] > 0 and merge.figures["oldest_unmerged_age_s"] is not None
    assert "6 unmerged generation(s)" in merge.reason
    merge_table(loc.uri)
    assert "merge" not in _due(probe_table(loc.uri, previous=first.state))


def test_merge_thresholds_defer_it_and_age_makes_it_due_without_reading(local_location):
    """With merge_min_generations above the backlog, merge waits for merge_max_age_s; the age is decided
    from the state with a later clock: an unchanged table is not read again for it."""
    loc = local_location
    build_table(loc, regions=1, generations=2)
    policy = ProbePolicy(merge_min_generations=5, merge_max_age_s=600)
    now = time.time() + LATER
    young = probe_table(loc.uri, policy, now=now)
    assert "merge" not in _due(young)
    old = probe_table(loc.uri, policy, young.state, now=now + 700)
    assert old.changed is False and "oldest unmerged generation" in _due(old)["merge"]


def test_catchup_due_after_a_merge_and_not_after_catch_up(local_location):
    loc = local_location
    build_table(loc, regions=2, generations=2)
    open_base(loc).create_scalar_index("name", "BTREE", name="name_idx")
    assert "catchup" not in _due(probe_table(loc.uri)), "nothing merged: the index covers the base"
    merge_table(loc.uri)
    due = probe_table(loc.uri)
    reason = _due(due)["catchup"]
    figures = due.due[[d.job for d in due.due].index("catchup")].figures
    assert "lags the merges by 2 generation(s)" in reason and figures["rows_to_index"] > 0
    catchup_table(loc.uri)
    assert "catchup" not in _due(probe_table(loc.uri, previous=due.state))


def test_catchup_due_when_an_index_has_more_segments_than_its_policy(local_location):
    """An index covering every row but in 2 segments (a delta added without a fold): due for a fold under
    max_segments 1, not under an unbounded per-index policy."""
    loc = local_location
    build_table(loc, regions=1, generations=1)
    open_base(loc).create_scalar_index("name", "BTREE", name="name_idx")
    merge_table(loc.uri)
    open_base(loc).optimize.optimize_indices(num_indices_to_merge=0)
    assert [len(d.segments) for d in open_base(loc).describe_indices() if d.name == "name_idx"] == [2]
    due = _due(probe_table(loc.uri, _policy(index_policy=IndexPolicy(max_segments=1))))
    assert due["catchup"] == "index name_idx has 2 segments > 1"
    unbounded = IndexPolicy(max_segments=1, max_segments_per_index={"name_idx": None})
    assert "catchup" not in _due(probe_table(loc.uri, _policy(index_policy=unbounded)))


def test_compaction_due_by_the_tables_rules(local_location):
    loc = local_location
    build_table(loc, regions=2, generations=1)
    merge_table(loc.uri)
    due = _due(probe_table(loc.uri, _policy(compaction=CompactionConfig(max_small_fragments=2))))
    assert due["compaction"].startswith("compaction is due: ") and "small fragments >= 2" in due["compaction"]
    assert "compaction" not in _due(probe_table(loc.uri))
    disabled = CompactionConfig(max_small_fragments=2, enabled=False)
    assert "compaction" not in _due(probe_table(loc.uri, _policy(compaction=disabled)))


def test_retention_due_on_old_versions_beyond_the_kept_and_not_tagged(local_location):
    loc = local_location
    build_table(loc, regions=1, generations=1)
    merge_table(loc.uri)
    versions = [v["version"] for v in open_base(loc).versions()]
    config = RetentionConfig(older_than_s=0, keep_versions=1)
    due = probe_table(loc.uri, _policy(retention=config), now=time.time() + LATER)
    retention = due.due[[d.job for d in due.due].index("retention")]
    assert retention.figures == {"versions": len(versions), "removable": len(versions) - 1, "oldest": 1}
    open_base(loc).tags.create("keep", 1)
    tagged = probe_table(loc.uri, _policy(retention=config), now=time.time() + LATER)
    assert tagged.due[[d.job for d in tagged.due].index("retention")].figures["removable"] == len(versions) - 2
    assert "retention" not in _due(probe_table(loc.uri, now=time.time() + LATER)), "the default keeps 7 days"
    open_base(loc).tags.delete("keep")
    retain_versions(loc.uri, config)
    assert "retention" not in _due(probe_table(loc.uri, _policy(retention=config), now=time.time() + LATER))


def test_snapshot_due_when_never_written_then_only_once_old_and_moved(local_location):
    loc = local_location
    regions = build_table(loc, regions=1, generations=1)
    assert _due(probe_table(loc.uri))["snapshot"] == "no MemWAL index snapshot was ever written (1 regions)"
    refresh_snapshot(loc.uri)
    fresh = probe_table(loc.uri)
    assert "snapshot" not in _due(fresh)
    later = time.time() + 7200
    assert "snapshot" not in _due(probe_table(loc.uri, previous=fresh.state, now=later)), "nothing moved"
    write_generations(loc, regions[0], [([5001], "x", [])])
    moved = probe_table(loc.uri, previous=fresh.state, now=later)
    assert "1 region manifest(s) moved since" in _due(moved)["snapshot"]
    assert "snapshot" not in _due(probe_table(loc.uri, previous=moved.state, now=time.time() + LATER))


def test_an_inline_snapshot_that_cannot_be_read_counts_as_moved(local_location, caplog):
    """Snapshot bytes this library cannot decode (a newer writer's, a damaged one) do not fail the probe: every
    region counts as moved, so an old snapshot is refreshed."""
    from dataclasses import replace

    from memwal.table import MemWalTable

    loc = local_location
    build_table(loc, regions=1, generations=1)
    refresh_snapshot(loc.uri)
    MemWalTable(loc.uri).commit_details(lambda d: replace(d, inline_snapshots=b"not a lance file"))
    result = probe_table(loc.uri, now=time.time() + 7200)
    assert "1 region manifest(s) moved since" in _due(result)["snapshot"]
    assert "the inline region snapshot cannot be read" in caplog.text


def test_gc_due_on_collectable_generations_and_not_after_gc(local_location):
    """Merged generations are held back by the retained versions; after retention GC is due, after GC not."""
    loc = local_location
    build_table(loc, regions=2, generations=2)
    merge_table(loc.uri)
    held = probe_table(loc.uri, _policy(gc=GcConfig(keep_manifest_versions=100)))
    assert "gc" not in _due(held), "retained versions still read the generations"
    assert {r["limited_by"] for r in held.state.facts["regions"].values()} == {"retained table version 1"}
    retain_versions(loc.uri, RetentionConfig(older_than_s=0, keep_versions=1))
    due = probe_table(loc.uri, previous=held.state)
    gc = due.due[-1]
    assert gc.job == "gc" and gc.figures["generations"] == 4 and gc.figures["bytes"] > 0
    assert "collectable: 4 generation(s)" in gc.reason
    assert "gc" not in _due(probe_table(loc.uri, _policy(gc=GcConfig(enabled=False)), due.state))
    gc_table(loc.uri)
    assert "gc" not in _due(probe_table(loc.uri, previous=due.state))


def test_gc_due_on_a_failed_flush_past_the_grace_period_without_any_read(local_location):
    """A generation directory no manifest lists moves nothing the key holds: the fresh listing shows it."""
    import shutil

    loc = local_location
    regions = build_table(loc, regions=1, generations=2)
    first = probe_table(loc.uri)
    store = loc.store()
    [listed] = [d for d in store.list_dirs(f"_mem_wal/{regions[0]}") if d.endswith("_gen_1")]
    shutil.copytree(f"{loc.uri}/_mem_wal/{regions[0]}/{listed}", f"{loc.uri}/_mem_wal/{regions[0]}/0badf1a5_gen_2")
    again = probe_table(loc.uri, previous=first.state, now=time.time() + 2 * 3600)
    assert again.changed is False and "1 failed flush(es)" in _due(again)["gc"]


def test_due_jobs_come_in_the_safe_order_and_the_state_survives_json(local_location):
    loc = local_location
    build_table(loc, regions=2, generations=2)
    open_base(loc).create_scalar_index("name", "BTREE", name="name_idx")
    merge_table(loc.uri)
    write_generations(loc, list_regions(loc.store())[0], [([9001], "y", [])])
    policy = _policy(compaction=CompactionConfig(max_small_fragments=2),
                     retention=RetentionConfig(older_than_s=0, keep_versions=1))
    now = time.time() + LATER  # one clock for both probes: the ages they report must not differ
    result = probe_table(loc.uri, policy, now=now)
    assert result.jobs == ["merge", "catchup", "compaction", "retention", "snapshot"]
    assert result.jobs == [j for j in JOB_ORDER if j in result.jobs]
    state = ProbeState.from_dict(json.loads(json.dumps(result.state.to_dict())))
    again = probe_table(loc.uri, policy, state, now=now)
    assert again.changed is False and again.due == result.due
    assert probe_table(loc.uri, previous=state).changed is True, "another policy: read again"


def test_one_corrupt_region_manifest_does_not_stop_the_sweep(local_location, caplog):
    """Three tables, one with its newest region manifest overwritten: that result names the table and the
    object, the other two are probed, and the next sweep reads the broken table again."""
    locs = [local_location.child(f"t{i}") for i in range(3)]
    regions = [build_table(loc, regions=2, generations=1) for loc in locs]
    from memwal import naming
    from memwal.region_manifest import latest_version

    bad_region = regions[1][0]
    path = naming.manifest_path(bad_region, latest_version(locs[1].store(), bad_region))
    with open(f"{locs[1].uri}/{path}", "wb") as f:
        f.write(b"not a manifest")
    results = {r.table_uri: r for r in probe_tables([loc.uri for loc in locs])}
    bad = results[locs[1].uri]
    assert bad.status == "error" and locs[1].uri in bad.error and path in bad.error and bad_region in bad.error
    assert bad.jobs == ["merge", "snapshot"], "the readable region's work is still listed"
    assert [results[loc.uri].status for loc in (locs[0], locs[2])] == ["ok", "ok"]
    assert path in caplog.text
    again = probe_tables([loc.uri for loc in locs], next_states(results.values()))
    assert {r.table_uri: r.changed for r in again} == {locs[0].uri: False, locs[1].uri: True, locs[2].uri: False}


def test_a_failing_table_is_a_result_not_an_exception(local_location, monkeypatch):
    """A storage error in one table's reads (here: Lance refusing to open it) is that table's result."""
    import memwal.probe as probe

    build_table(local_location, regions=1, generations=1)

    def refuse(*args, **kwargs):
        raise OSError("permission denied: _versions/1.manifest")

    monkeypatch.setattr(probe, "_read_facts", refuse)
    result = probe_table(local_location.uri)
    assert result.status == "error" and result.state is None
    assert result.error == f"table {local_location.uri}: permission denied: _versions/1.manifest"


def test_probe_command_prints_what_is_due_per_table(local_location, tmp_path, capsys):
    import os

    root = local_location.uri
    build_table(local_location.child("a.lance"), regions=1, generations=1)
    os.mkdir(f"{root}/plain")
    assert main(["probe", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"{root}/a.lance: merge: 1 unmerged generation(s)" in out
    assert f"{root}/plain: not_a_table" in out
    assert main(["probe", f"{root}/a.lance", "--json"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert [d["job"] for d in json.loads(line)["due"]] == ["merge", "snapshot"]
    assert main(["probe", str(tmp_path / "missing")]) == 1
    assert f"table root {tmp_path / 'missing'} cannot be listed: no such directory" in capsys.readouterr().err


def test_probe_entry_kinds(local_location):
    with pytest.raises(BadInputError, match="kind 'tables'"):
        ProbeEntry(local_location.uri, kind="tables")
    build_table(local_location, regions=1, generations=1)
    [as_table] = probe_tables([ProbeEntry(local_location.uri, kind="table", name="t")])
    assert as_table.name == "t" and as_table.jobs == ["merge", "snapshot"]
