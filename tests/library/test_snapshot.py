import uuid

from memwal.mem_wal_index import load_index
from memwal.snapshot import read_snapshot, refresh_snapshot
from memwal.table import MemWalTable

from support.maintenance import build_table, merge_region


def test_inline_snapshot_has_one_row_per_region_with_the_spec_schema(location):
    loc = location
    ids = build_table(loc, regions=3, generations=2, bucket_column="id", num_buckets=4)
    summary = refresh_snapshot(MemWalTable(loc.uri, loc.storage_options))
    assert summary.storage == "inline" and summary.num_regions == 3
    details = load_index(loc.uri, loc.storage_options).details
    assert details.num_regions == 3 and details.snapshot_ts_millis == summary.snapshot_ts_millis
    snap = read_snapshot(MemWalTable(loc.uri, loc.storage_options))
    assert sorted(str(uuid.UUID(bytes=b)) for b in snap.column("region_id").to_pylist()) == sorted(ids)
    assert snap.schema.field("region_id").type.byte_width == 16
    assert "region_field_bucket" in snap.column_names
    row = snap.to_pylist()[0]
    assert row["current_generation"] == 3 and [g["generation"] for g in row["flushed_generations"]] == [1, 2]
    assert row["region_field_bucket"] is not None, "region field value computed from the region's rows"


def test_external_snapshot_above_threshold(local_location):
    loc = local_location
    build_table(loc, regions=3, generations=1)
    summary = refresh_snapshot(loc.uri, inline_threshold=2)
    index = load_index(loc.uri)
    assert summary.storage == "external" and index.details.inline_snapshots is None
    assert loc.store().exists(f"_indices/{index.entry_uuid}/index.lance")
    assert read_snapshot(loc.uri).num_rows == 3


def test_snapshot_refresh_racing_a_merge_keeps_merged_generations(local_location, monkeypatch):
    """A merge commits between the snapshot's read and its commit: merged_generations must survive."""
    import memwal.snapshot as snap_mod

    loc = local_location
    a, _ = build_table(loc, regions=2, generations=2)
    real = snap_mod.snapshot_table

    def snapshot_then_merge(*args, **kwargs):
        table = real(*args, **kwargs)
        merge_region(loc.uri, None, a)  # lands after the snapshot job read the index
        return table

    monkeypatch.setattr(snap_mod, "snapshot_table", snapshot_then_merge)
    refresh_snapshot(loc.uri)
    details = load_index(loc.uri).details
    assert details.merged_generations[a] == 2, "snapshot refresh must never overwrite merge progress"
    assert details.num_regions == 2


def test_external_snapshot_is_still_found_after_a_merge_rekeys_the_index_entry(local_location):
    """Lance core's merge commit gives __lance_mem_wal a fresh UUID; the file stays under the old one."""
    loc = local_location
    a, _, _ = build_table(loc, regions=3, generations=2)
    refresh_snapshot(loc.uri, inline_threshold=2)
    before = load_index(loc.uri).entry_uuid
    merge_region(loc.uri, None, a)
    assert load_index(loc.uri).entry_uuid != before, "the scenario needs Lance core's re-keying"
    assert read_snapshot(loc.uri).num_rows == 3


def test_a_lost_external_snapshot_reads_as_none_not_an_error(local_location):
    loc = local_location
    build_table(loc, regions=3, generations=1)
    refresh_snapshot(loc.uri, inline_threshold=2)
    loc.store().delete_prefix("_indices")
    assert read_snapshot(loc.uri) is None
