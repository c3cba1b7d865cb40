"""Table health (memwal.health) and its thresholds: fragments, deleted rows, versions, bytes, and what GC
could free with what holds it back."""

from __future__ import annotations

import json

from memwal.cli import main
from memwal.compaction import CompactionConfig, compact_table
from memwal.gc import gc_table
from memwal.health import table_health
from memwal.lag import breaches
from memwal.merge import merge_table
from memwal.retention import RetentionConfig, retain_versions
from memwal.table import MemWalTable

from support.maintenance import build_table
from support.tables import open_base


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


def _add_versions(uri: str, storage_options: dict | None, upto: int) -> int:
    """Metadata-only commits until the table has version `upto` (fragments and `_mem_wal/` stay the same);
    returns how many versions Lance keeps."""
    import lance

    ds = lance.dataset(uri, storage_options=storage_options)
    while ds.version < upto:
        ds.update_config({"test.tick": str(ds.version)})
    return len(ds.versions())


def test_lag_check_health_requests_do_not_grow_with_versions(s3_location):
    """The lag monitor's reading (status + health, `measure(health=True)`) on a table with N and then 2N
    retained versions makes the same S3 requests, Lance's and ours (counted by a proxy): no GC plan, no
    manifest of an older version read. The storage reading (`memwal status`, the page) still grows."""
    from memwal.lag import measure

    from support.locations import s3_options
    from support.s3_requests import counting_proxy

    loc = s3_location
    build_table(loc, regions=2, generations=3)
    merge_table(MemWalTable(loc.uri, loc.storage_options))
    seen = {}
    with counting_proxy(loc.storage_options["aws_endpoint"]) as proxy:
        via_proxy = {**loc.storage_options, **{"aws_endpoint": proxy.endpoint}}
        assert s3_options(proxy.endpoint).keys() <= via_proxy.keys()
        for n in (20, 40):
            kept = _add_versions(loc.uri, loc.storage_options, n)
            proxy.reset()
            summary = measure(MemWalTable(loc.uri, via_proxy), health=True)
            manifests = sum(1 for kind, path in proxy.paths if "/_versions/" in path and path.endswith(".manifest"))
            seen[n] = (dict(proxy.counts), manifests)
            seen[n, "health"] = (summary["health"]["table_versions"], kept)
            proxy.reset()
            table_health(MemWalTable(loc.uri, via_proxy))
            seen[n, "storage"] = sum(1 for _, path in proxy.paths if "/_versions/" in path)
    print("lag check requests (kinds, manifest GETs) at 20 and 40 versions:", seen)
    assert seen[20] == seen[40], "a lag check's requests do not grow with the versions the table keeps"
    assert seen[20, "health"][0] == seen[20, "health"][1] and seen[40, "health"][0] == seen[40, "health"][1]
    assert seen[40, "storage"] > seen[20, "storage"], "the storage reading reads every retained version"


def test_lag_check_health_reads_no_older_version(local_location):
    """Locally: the lag check loads the MemWAL index once (the latest), with N and 2N versions."""
    from memwal.lag import measure

    from support.open_counts import count_opens

    build_table(local_location, regions=2, generations=3)
    merge_table(local_location.uri)
    for n in (12, 24):
        _add_versions(local_location.uri, None, n)
        with count_opens(local_location.uri) as counts:
            summary = measure(local_location.uri, health=True)
        assert counts["index"] == 1, f"{n} versions: one index load, no older version's manifest read"
        assert summary["health"]["table_versions"] == n


def test_manifest_reading_and_storage_reading_say_what_they_hold(local_location):
    """The manifest reading leaves every storage figure out (None, no measured-at time); the storage reading
    carries its time; `table_versions` from the `_versions/` listing equals Lance's versions()."""
    import lance

    from memwal.health import STORAGE_KEYS, storage_health

    build_table(local_location, regions=2, generations=3)
    merge_table(local_location.uri)
    ds = lance.dataset(local_location.uri)
    cheap = table_health(local_location.uri, storage=False).to_dict()
    assert all(cheap[k] is None for k in STORAGE_KEYS)
    assert cheap["table_versions"] == len(ds.versions()) and cheap["oldest_table_version"] == 1
    assert cheap["data_bytes"] == sum(f.file_size_bytes for fr in ds.get_fragments() for f in fr.metadata.files) > 0
    full = table_health(local_location.uri).to_dict()
    assert {k: v for k, v in full.items() if k not in STORAGE_KEYS} == {
        k: v for k, v in cheap.items() if k not in STORAGE_KEYS}
    assert full["storage_measured_at"] and full["base_bytes"] >= full["data_bytes"]
    assert full["gc_limited_by"] and full["generation_dirs"] == 6
    reading = storage_health(local_location.uri)
    assert table_health(local_location.uri, storage=False).with_storage(reading).to_dict()["mem_wal_bytes"] == (
        reading.mem_wal_bytes)
