from memwal.status import table_status

from support.maintenance import build_table, merge_region


def test_status_reports_backlog_and_progress(local_location):
    loc = local_location
    a, b = build_table(loc, regions=2, generations=3)
    merge_region(loc.uri, None, a, up_to_generation=2)
    status = {r.region_id: r for r in table_status(loc.uri).regions}
    assert status[a].merged_generation == 2 and status[a].unmerged_generations == 1
    assert status[b].merged_generation == 0 and status[b].unmerged_generations == 3
    assert status[b].unmerged_rows == 2 + 3 + 2, "gen 2 holds 2 puts + 1 delete"
    assert status[b].unmerged_bytes > 0 and status[b].oldest_unmerged_age_s >= 0
    assert status[a].writer_epoch == 1 and status[a].current_generation == 4
    assert status[a].flushed_generations == [1, 2, 3]


def test_status_to_dict_totals(local_location):
    loc = local_location
    build_table(loc, regions=2, generations=2)
    d = table_status(loc.uri).to_dict()
    assert d["num_regions"] == 2 and d["unmerged_generations"] == 4
