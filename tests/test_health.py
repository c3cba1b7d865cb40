"""Table health (memwal.health) and its thresholds: fragments, deleted rows, versions, bytes, and what GC
could free with what holds it back."""

from __future__ import annotations

import json

from maintenance import build_table
from tables import open_base

from memwal.cli import main
from memwal.compaction import CompactionConfig, compact_table
from memwal.gc import gc_table
from memwal.health import table_health
from memwal.lag import breaches
from memwal.merge import merge_table
from memwal.retention import RetentionConfig, retain_versions
from memwal.table import MemWalTable


def test_health_follows_merge_compaction_retention_and_gc(location):
    """2 regions x 3 generations: before retention GC is held back by a retained version and could free
    nothing; compaction lowers fragments, retention lowers versions, then GC's reclaimable bytes are freed."""
    loc = location
    build_table(loc, regions=2, generations=3)
    merge_table(MemWalTable(loc.uri, loc.storage_options))
    h = table_health(MemWalTable(loc.uri, loc.storage_options))
    assert h.fragments == 2 and h.small_fragments == 2 and h.oldest_table_version == 1
    assert h.table_versions == len(open_base(loc).versions()) >= 3
    assert h.base_bytes > 0 and h.mem_wal_bytes > 0 and h.generation_dirs == 6
    assert h.gc_reclaimable.get("generation") is None
    assert all(v.startswith("retained table version") for v in h.gc_limited_by.values()) and len(h.gc_limited_by) == 2
    table = MemWalTable(loc.uri, loc.storage_options)
    compact_table(table, CompactionConfig(force=True, target_rows_per_fragment=1000))
    retain_versions(table, RetentionConfig(older_than_s=0, keep_versions=1))
    h2 = table_health(table)
    assert h2.fragments == 1 and h2.table_versions == 1 and h2.deleted_rows == 0
    assert h2.gc_reclaimable["generation"] == 6 and h2.gc_reclaimable_bytes > 0
    gc_table(MemWalTable(loc.uri, loc.storage_options))
    h3 = table_health(MemWalTable(loc.uri, loc.storage_options))
    assert h3.generation_dirs == 0 and h3.mem_wal_bytes < h2.mem_wal_bytes - h2.gc_reclaimable_bytes // 2


def test_health_thresholds_breach_like_lag_thresholds():
    summary = {"regions": [], "num_regions": 0,
               "health": {"fragments": 70, "small_fragments": 3, "deleted_ratio": 0.3, "table_versions": 12,
                          "mem_wal_bytes": 10}}
    found = breaches(summary, {"max_fragments": 64, "max_deleted_ratio": 0.2, "max_table_versions": 20,
                               "max_mem_wal_bytes": 100})
    assert [b["metric"] for b in found] == ["fragments", "deleted_ratio"]
    assert found[0]["message"] == "table: fragments 70 > 64" and found[0]["key"] == "table:fragments"
    assert breaches({"regions": []}, {"max_fragments": 1}) == [], "no health measured: nothing to hold against"


def test_status_shows_health_and_alerts_on_it(local_location, capsys):
    build_table(local_location, regions=1, generations=2)
    merge_table(local_location.uri)
    assert main(["status", local_location.uri]) == 0
    out = capsys.readouterr().out
    assert "health: " in out and "table versions" in out and "gc: could free" in out and "held back by" in out
    assert main(["status", local_location.uri, "--json", "--max-table-versions", "1"]) == 4
    captured = capsys.readouterr()
    status = json.loads(captured.out)
    assert status["health"]["table_versions"] > 1 and "table_versions" in captured.err
    assert main(["status", local_location.uri, "--json", "--no-health"]) == 0
    assert "health" not in json.loads(capsys.readouterr().out)
