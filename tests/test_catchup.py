from maintenance import build_table, merge_region
from tables import open_base

from memwal.catchup import catchup_table
from memwal.mem_wal_index import load_index
from memwal.merge import merge_table
from memwal.status import table_status


def test_catchup_rebuilds_index_and_records_merged_generation(local_location):
    loc = local_location
    a, b = build_table(loc, regions=2, generations=3)
    open_base(loc).create_scalar_index("name", "BTREE", name="name_idx")
    merge_table(loc.uri)
    before = open_base(loc).stats.index_stats("name_idx")
    assert before["num_unindexed_rows"] > 0, "merged rows start out unindexed"
    summary = catchup_table(loc.uri)
    result = summary.indexes[0]
    assert result.index_name == "name_idx" and result.optimized and result.covered
    assert open_base(loc).stats.index_stats("name_idx")["num_unindexed_rows"] == 0
    catchup = load_index(loc.uri).details.index_catchup["name_idx"]
    assert catchup == {a: 3, b: 3}
    assert all(r.index_lag_generations == 0 for r in table_status(loc.uri).regions)


def test_catchup_never_records_more_than_the_index_covers(local_location, monkeypatch):
    """Merges landing after catch-up read the table are not claimed."""
    import lance

    loc = local_location
    a, _ = build_table(loc, regions=2, generations=3)
    open_base(loc).create_scalar_index("name", "BTREE", name="name_idx")
    merge_region(loc.uri, None, a, up_to_generation=1)
    real = lance.LanceDataset.describe_indices
    state = {"merged": False}

    def merge_meanwhile(self, *args, **kwargs):
        if not state["merged"]:
            state["merged"] = True
            merge_region(loc.uri, None, a)  # generations 2..3 land after V0
        return real(self, *args, **kwargs)

    monkeypatch.setattr(lance.LanceDataset, "describe_indices", merge_meanwhile)
    catchup_table(loc.uri, index_names=["name_idx"])
    monkeypatch.undo()
    assert load_index(loc.uri).details.index_catchup["name_idx"][a] == 1, "only what V0 had merged"
    assert load_index(loc.uri).details.merged_generations[a] == 3
