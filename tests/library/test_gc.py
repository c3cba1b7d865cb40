import time
from datetime import timedelta

from memwal import naming
from memwal.gc import GcConfig, gc_table
from memwal.merge import merge_table
from memwal.reader import LsmReader
from memwal.region_manifest import list_manifest_versions, load_latest_manifest
from memwal.table import MemWalTable
from memwal.wal import list_wal_positions

from support.maintenance import build_table, merge_region
from support.tables import open_base, sorted_rows


def _gen_dirs(store, region):
    return sorted(d for d in store.list_dirs(naming.region_dir(region)) if "_gen_" in d)


def test_dry_run_lists_but_deletes_nothing(location):
    loc = location
    build_table(loc, regions=2, generations=3)
    merge_table(MemWalTable(loc.uri, loc.storage_options))
    open_base(loc).cleanup_old_versions(older_than=timedelta(0))
    store = loc.store()
    before = sorted(m.path for m in store.list("_mem_wal"))
    summary = gc_table(MemWalTable(loc.uri, loc.storage_options), config=GcConfig(dry_run=True))
    assert sorted(m.path for m in store.list("_mem_wal")) == before, "a dry run must not delete anything"
    assert summary.to_dict()["would_delete"]["wal_entry"] > 0
    assert summary.to_dict()["bytes"] > 0


def test_gc_keeps_generations_a_retained_version_still_needs(local_location):
    """Time travel: at the version before the merge, generations 1..3 are unmerged and must stay."""
    loc = local_location
    a, _ = build_table(loc, regions=2, generations=3)
    merge_region(loc.uri, None, a)
    summary = gc_table(loc.uri)
    region = next(r for r in summary.regions if r.region_id == a)
    assert region.safe_generation == 0 and region.limited_by.startswith("retained table version")
    assert len(_gen_dirs(loc.store(), a)) == 3


def test_gc_removes_merged_generations_once_no_version_needs_them(local_location):
    loc = local_location
    a, b = build_table(loc, regions=2, generations=3)
    merge_table(loc.uri)
    expected = sorted_rows(LsmReader(loc.uri).scan())
    ds = open_base(loc)
    ds.cleanup_old_versions(older_than=timedelta(0))
    store = loc.store()
    wal_before = list_wal_positions(store, a)
    summary = gc_table(loc.uri, config=GcConfig(keep_manifest_versions=2))
    assert _gen_dirs(store, a) == [] and _gen_dirs(store, b) == []
    assert load_latest_manifest(store, a).flushed_generations == (), "the manifest no longer lists them"
    assert list_wal_positions(store, a) == [] and wal_before
    assert len(list_manifest_versions(store, a)) == 2
    assert sorted_rows(LsmReader(loc.uri).scan()) == expected, "GC must not change what readers see"
    assert summary.to_dict()["deleted"]["generation"] == 6


def test_gc_respects_index_catchup(local_location):
    from memwal.catchup import catchup_table

    loc = local_location
    (a,) = build_table(loc, regions=1, generations=3)
    open_base(loc).create_scalar_index("name", "BTREE", name="name_idx")
    merge_region(loc.uri, None, a, up_to_generation=1)
    catchup_table(loc.uri)
    merge_region(loc.uri, None, a)
    open_base(loc).cleanup_old_versions(older_than=timedelta(0))
    region = gc_table(loc.uri).regions[0]
    assert region.safe_generation == 1 and region.limited_by == "index_catchup[name_idx]"
    assert len(_gen_dirs(loc.store(), a)) == 2


def test_failed_flush_leftover_removed_only_after_grace(local_location):
    """A failed first attempt at generation 2 (its retry is listed; current_generation is 3)."""
    loc = local_location
    (a,) = build_table(loc, regions=1, generations=2)
    store = loc.store()
    leftover = naming.generation_dir(a, "deadbeef_gen_2")
    store.put(f"{leftover}/data/x.lance", b"partial")
    gc_table(loc.uri, config=GcConfig(grace_period_s=3600))
    assert store.exists(f"{leftover}/data/x.lance"), "inside the grace period a flush may still be running"
    time.sleep(0.01)
    summary = gc_table(loc.uri, config=GcConfig(grace_period_s=0))
    assert not store.exists(f"{leftover}/data/x.lance")
    assert [x.kind for x in summary.actions if x.path == leftover] == ["failed_flush"]
    assert len(_gen_dirs(store, a)) == 2, "the flushed generations stay (not merged)"


def test_gc_never_touches_a_flush_in_flight_even_with_zero_grace(local_location):
    """A directory for the generation being flushed (>= current_generation) is not a leftover yet."""
    loc = local_location
    (a,) = build_table(loc, regions=1, generations=1)
    store = loc.store()
    in_flight = naming.generation_dir(a, "cafef00d_gen_2")  # current_generation is 2
    store.put(f"{in_flight}/data/x.lance", b"being written")
    gc_table(loc.uri, config=GcConfig(grace_period_s=0))
    assert store.exists(f"{in_flight}/data/x.lance"), "a flush in flight must survive GC"



def test_an_index_without_a_catchup_entry_is_caught_up_only_while_it_covers_every_fragment(local_location):
    """An index built before MemWAL was initialised (as on a table Lance core or LanceDB made) has no
    index_catchup entry; merged rows land in fragments it does not cover, so GC must keep the generations
    and status must show the lag until catch-up records them (the spec's "absent is caught up" holds only
    while the index covers every live fragment)."""
    import uuid

    from memwal.catchup import catchup_table
    from memwal.gc import safe_generation
    from memwal.index_coverage import with_coverage
    from memwal.mem_wal_index import load_index
    from memwal.status import table_status

    from support.maintenance import write_generations
    from support.tables import create_base

    loc = local_location
    create_base(loc, ids=range(10))
    open_base(loc).create_scalar_index("name", "BTREE", name="early_idx")
    open_base(loc).initialize_mem_wal(unsharded=True)
    a = str(uuid.uuid4())
    write_generations(loc, a, [([100], "x", []), ([101], "y", [])])
    merge_region(loc.uri, None, a)
    open_base(loc).cleanup_old_versions(older_than=timedelta(0))
    assert load_index(loc.uri).details.index_catchup == {}, "the case: no entry for an index that exists"
    region = gc_table(loc.uri, config=GcConfig(dry_run=True)).regions[0]
    assert (region.safe_generation, region.limited_by) == (0, "index_catchup[early_idx]"), region
    assert not [x for x in region.actions if x.kind == "generation"]
    assert table_status(loc.uri).regions[0].index_lag_generations == 2
    table = MemWalTable(loc.uri)
    assert with_coverage(table.index, table.dataset, ["no_such_idx"]).details.index_catchup == {}, \
        "an index Lance does not have has nothing to wait for"
    assert safe_generation(table.index, a, ["no_such_idx"], {}) == (2, "merged_generations")

    assert catchup_table(loc.uri).indexes[0].covered
    open_base(loc).cleanup_old_versions(older_than=timedelta(0))
    assert gc_table(loc.uri, config=GcConfig(dry_run=True)).regions[0].safe_generation == 2
    assert table_status(loc.uri).regions[0].index_lag_generations == 0
