"""Bounded index segments on real Lance tables with IVF_PQ, FTS and BTREE indexes maintained through MemWAL:
catch-up folds a vector index past its bound (Lance's num_indices_to_merge, no retraining), searches stay
exact, compaction names the segments that block it and combines fragments once they are folded, and an
explicit rebuild retrains with the existing parameters."""

from __future__ import annotations

import lance
import numpy as np
import pytest

from memwal.catchup import catchup_table, rebuild_indexes
from memwal.compaction import compact_table
from memwal.index_segments import indices_to_merge, rebuild_vector_index, segment_counts
from memwal.maintenance_config import CompactionConfig, IndexPolicy
from memwal.merge import merge_table
from memwal.table import MemWalTable

from support.vector_tables import create_vector_table, text_of, vectors, write_generation

BASE_ROWS = 3000
# every fragment of these tables is small: compaction is due once a few are there
DUE = CompactionConfig(max_small_fragments=4)


def _cycle(loc, region: str, c: int, model: dict[int, int]) -> None:
    """Writes (new rows, upserts of old ones, a delete), one merge; the model follows (id -> version)."""
    new = list(range(BASE_ROWS + 40 * c, BASE_ROWS + 40 * c + 40))
    old = list(range(25 * c, 25 * c + 10))
    gone = [BASE_ROWS - 1 - c]
    write_generation(loc, region, new + old, version=c + 1, delete_ids=gone)
    for i in new + old:
        model[i] = c + 1
    for i in gone:
        model.pop(i, None)
    merge_table(loc.uri)


def _model() -> dict[int, int]:
    return dict.fromkeys(range(BASE_ROWS), 0)


def _dataset(loc) -> lance.LanceDataset:
    return MemWalTable(loc.uri, loc.storage_options).refresh().dataset


def _assert_searches_match(ds: lance.LanceDataset, model: dict[int, int]) -> None:
    """ANN (every partition probed, refined over every row), exact search, FTS and a BTREE filter equal the
    model."""
    ids = np.array(sorted(model))
    matrix = np.concatenate([vectors([i], model[i]) for i in ids])
    partitions = max(s["num_partitions"] for s in ds.stats.index_stats("vec_idx")["segments"])
    for seed in range(3):
        q = np.random.default_rng(1000 + seed).standard_normal(16).astype("float32")
        expected = ids[np.argsort(((matrix - q) ** 2).sum(axis=1))[:10]].tolist()
        ann = ds.to_table(columns=["id"], nearest={"column": "vec", "q": q, "k": 10, "nprobes": partitions,
                                                   "refine_factor": len(ids)})["id"].to_pylist()
        exact = ds.to_table(columns=["id"], nearest={"column": "vec", "q": q, "k": 10,
                                                     "use_index": False})["id"].to_pylist()
        assert ann == expected and exact == expected, (seed, ann, exact, expected)
    for i in (5, BASE_ROWS + 3, BASE_ROWS - 1):  # an upserted row, a new row, a deleted one
        hits = ds.to_table(columns=["id"], full_text_query=f"doc{i}v{model.get(i, 0)}")["id"].to_pylist()
        assert hits == ([i] if i in model else []), (i, hits)
    apple = sorted(i for i, v in model.items() if "apple" in text_of(i, v).split())
    assert sorted(ds.to_table(columns=["id"], full_text_query="apple")["id"].to_pylist()) == apple
    assert sorted(ds.to_table(columns=["id"], filter="id >= 3000 AND id < 3100")["id"].to_pylist()) == \
        [i for i in ids.tolist() if 3000 <= i < 3100]
    assert ds.count_rows() == len(model)


def test_fold_decision():
    assert indices_to_merge(3, appending=True, max_segments=4) is None, "4 after the append: within the bound"
    assert indices_to_merge(4, appending=True, max_segments=4, newest_small=4) == 4, "5: fold all into one"
    assert indices_to_merge(4, appending=True, max_segments=4, newest_small=3) == 3, "the base segment stays"
    assert indices_to_merge(4, appending=True, max_segments=4) == 1, "no small fragment: the newest + new rows"
    assert indices_to_merge(4, appending=False, max_segments=4) is None
    assert indices_to_merge(6, appending=False, max_segments=4) == 3, "over the bound already (policy lowered)"
    assert indices_to_merge(3, appending=False, max_segments=4, newest_small=2, blocked=True) == 2
    assert indices_to_merge(40, appending=True, max_segments=None, newest_small=40, blocked=True) is None, \
        "unbounded: Lance's default"
    assert IndexPolicy(max_segments_per_index={"vec_idx": 2}).limit("vec_idx") == 2
    assert IndexPolicy().limit("other") == 4
    with pytest.raises(ValueError, match=r"max_segments_per_index\.vec_idx: 0"):
        IndexPolicy(max_segments_per_index={"vec_idx": 0})


def test_catch_up_cycles_keep_vector_segments_bounded_and_searches_exact(local_location):
    loc = local_location
    (region,) = create_vector_table(loc, BASE_ROWS)
    model = _model()
    seen, summaries = [], []
    for c in range(8):
        _cycle(loc, region, c, model)
        summaries.append(catchup_table(loc.uri).to_dict())  # the default policy: at most 4 segments
        counts = segment_counts(_dataset(loc))
        assert max(counts.values()) <= 4, (c, counts)
        seen.append(counts["vec_idx"])
    assert max(seen) == 4, ("the bound was reached", seen)
    for summary, count in zip(summaries, seen, strict=True):
        assert all(r["covered"] and not r["error"] for r in summary["indexes"]), summary
        vec = next(r for r in summary["indexes"] if r["index_name"] == "vec_idx")
        assert vec["segments_after"] == count
    assert any(r["folded_segments"] == 4 for s in summaries for r in s["indexes"]), "folded 4 (+ the new rows) into 1"
    ds = _dataset(loc)
    assert all(ds.stats.index_stats(n)["num_unindexed_rows"] == 0 for n in ("vec_idx", "text_idx", "id_idx"))
    _assert_searches_match(ds, model)


def test_compaction_names_blocking_segments_then_the_fold_lets_it_combine_fragments(local_location):
    loc = local_location
    (region,) = create_vector_table(loc, BASE_ROWS)
    model = _model()
    for c in range(3):
        _cycle(loc, region, c, model)
        catchup_table(loc.uri, policy=IndexPolicy(max_segments=None))  # unbounded: one more segment each
    assert segment_counts(_dataset(loc))["vec_idx"] == 4
    blocked = compact_table(loc.uri, DUE)
    assert blocked.due, "compaction is due"
    assert blocked.blocked_by_index_segments == {"vec_idx": 4}, blocked.to_dict()
    assert blocked.health_after["fragments"] > 2, "fragments of different segments stay apart"
    _assert_searches_match(_dataset(loc), model)

    from dataclasses import replace

    off = catchup_table(loc.uri, compaction=replace(DUE, enabled=False)).indexes
    assert not any(r.folded_segments for r in off), "no compaction: within the bound, nothing to fold for"
    # within the default bound (4), but blocking a due compaction: the next catch-up folds them
    result = {r.index_name: r for r in catchup_table(loc.uri, compaction=DUE).indexes}["vec_idx"]
    assert result.folded_segments == 4 and result.segments_after == 1, result
    after_fold = compact_table(loc.uri, DUE)
    assert after_fold.blocked_by_index_segments == {}
    assert after_fold.health_after["fragments"] < blocked.health_after["fragments"]
    assert after_fold.health_after["fragments"] <= 2, after_fold.to_dict()
    ds = _dataset(loc)
    assert ds.stats.index_stats("vec_idx")["num_unindexed_rows"] == 0
    _assert_searches_match(ds, model)


def test_unbounded_policy_never_folds(local_location):
    loc = local_location
    (region,) = create_vector_table(loc, BASE_ROWS)
    model = _model()
    for c in range(6):
        _cycle(loc, region, c, model)
        summary = catchup_table(loc.uri, policy=IndexPolicy(max_segments=None), compaction=DUE)
        assert not any(r.folded_segments for r in summary.indexes)
    assert segment_counts(_dataset(loc))["vec_idx"] == 7, "the base's segment and one delta per catch-up"


def test_rebuild_retrains_the_vector_index_with_its_parameters(local_location):
    loc = local_location
    (region,) = create_vector_table(loc, BASE_ROWS)
    model = _model()
    for c in range(2):
        _cycle(loc, region, c, model)
        _dataset(loc).optimize.optimize_indices(index_names=["vec_idx"], num_indices_to_merge=0)  # a delta each
    catchup_table(loc.uri, policy=IndexPolicy(max_segments=None))
    ds = _dataset(loc)
    before = next(d for d in ds.describe_indices() if d.name == "vec_idx").details
    assert [s["num_partitions"] for s in ds.stats.index_stats("vec_idx")["segments"]] == [4, 4, 4]
    table = MemWalTable(loc.uri)
    assert rebuild_indexes(table, ["vec_idx", "text_idx"]) == ["vec_idx", "text_idx"]
    ds = _dataset(loc)
    stats = ds.stats.index_stats("vec_idx")
    after = next(d for d in ds.describe_indices() if d.name == "vec_idx").details
    assert stats["num_segments"] == 1 and stats["num_unindexed_rows"] == 0
    assert stats["segments"][0]["num_partitions"] == 4, "the partitions it had (Lance's retrain picks its own)"
    assert after["metric_type"] == before["metric_type"] and after["compression"] == before["compression"]
    assert catchup_table(loc.uri).indexes[0].covered
    _assert_searches_match(ds, model)
    with pytest.raises(ValueError, match=r"index text_idx .*rebuilding it is not supported"):
        rebuild_vector_index(ds, "text_idx")


def test_fts_and_btree_segments_fold_and_stay_correct(local_location):
    """Scalar and FTS indexes with delta segments (another tool's catch-up, num_indices_to_merge=0) are
    folded by the same rule, and their queries stay correct."""
    loc = local_location
    (region,) = create_vector_table(loc, BASE_ROWS)
    model = _model()
    for c in range(3):
        _cycle(loc, region, c, model)
        _dataset(loc).optimize.optimize_indices(index_names=["text_idx", "id_idx"], num_indices_to_merge=0)
    assert {k: v for k, v in segment_counts(_dataset(loc)).items() if k != "vec_idx"} == {"text_idx": 4, "id_idx": 4}
    _cycle(loc, region, 3, model)
    results = {r.index_name: r for r in catchup_table(loc.uri, policy=IndexPolicy(max_segments=2)).indexes}
    assert results["text_idx"].folded_segments == 4 and results["id_idx"].folded_segments == 4
    counts = segment_counts(_dataset(loc))
    assert counts["text_idx"] == 1 and counts["id_idx"] == 1
    ds = _dataset(loc)
    assert ds.stats.index_stats("text_idx")["num_unindexed_rows"] == 0
    _assert_searches_match(ds, model)


def test_a_fold_leaves_the_segment_over_large_fragments(local_location):
    """With the base fragment large by compaction's rules, catch-up folds the delta segments (over the small
    fragments it would combine) and leaves the base segment, the largest, as it is."""
    loc = local_location
    (region,) = create_vector_table(loc, BASE_ROWS)
    model = _model()
    rules = CompactionConfig(target_rows_per_fragment=2000, max_small_fragments=4)  # the base (3000) is large
    base_uuid = next(d for d in _dataset(loc).describe_indices() if d.name == "vec_idx").segments[0].uuid
    for c in range(3):
        _cycle(loc, region, c, model)
        _dataset(loc).optimize.optimize_indices(index_names=["vec_idx"], num_indices_to_merge=0)  # a delta each
    assert segment_counts(_dataset(loc))["vec_idx"] == 4
    _cycle(loc, region, 3, model)
    result = {r.index_name: r for r in catchup_table(loc.uri, compaction=rules).indexes}["vec_idx"]
    assert result.folded_segments == 3 and result.segments_after == 2, result
    segments = next(d for d in _dataset(loc).describe_indices() if d.name == "vec_idx").segments
    assert segments[0].uuid == base_uuid, "the base segment was not rewritten"
    compacted = compact_table(loc.uri, rules)
    assert compacted.blocked_by_index_segments == {} and compacted.health_after["fragments"] == 2
    _assert_searches_match(_dataset(loc), model)


def test_compaction_before_catch_up_names_the_fragments_no_index_covers_yet(local_location):
    """A small indexed base, then merges whose new fragments no index covers yet: Lance combines the new
    fragments among themselves but not with the indexed one, so compaction (due at 2 small fragments) is
    still due after its run and says why (`blocked_by_unindexed_fragments`: every index, 1 fragment); once
    catch-up has covered them (folding the vector index's segments, which would block it too), compaction
    combines all."""
    loc = local_location
    (region,) = create_vector_table(loc, BASE_ROWS)
    model = _model()
    for c in range(3):
        _cycle(loc, region, c, model)
    due_at_two = CompactionConfig(max_small_fragments=2)
    blocked = compact_table(loc.uri, due_at_two)
    assert blocked.tasks_committed == 1 and blocked.health_after["fragments"] == 2, blocked.to_dict()
    assert blocked.blocked_by_unindexed_fragments == {"vec_idx": 1, "text_idx": 1, "id_idx": 1}, blocked.to_dict()
    assert blocked.blocked_by_index_segments == {}
    catchup_table(loc.uri, compaction=due_at_two)  # covers them (and folds what would block the compaction)
    after = compact_table(loc.uri, due_at_two)
    assert after.blocked_by_unindexed_fragments == {} and after.health_after["fragments"] == 1, after.to_dict()
    _assert_searches_match(_dataset(loc), model)


def test_catch_up_keeps_the_vector_index_partitions(local_location):
    """A 64-partition IVF_PQ over 20,000 rows, new rows merged, caught up with the default policy (no fold
    due): the index keeps its 64 partitions in every segment. Lance's default optimize_indices (what
    catch-up called before) rebuilt it as one segment of 1-2 partitions: every query then reads every code."""
    import uuid

    from memwal.storage import lance_storage_options

    from support.vector_tables import vector_rows

    loc = local_location
    opts = lance_storage_options(loc.storage_options)
    ds = lance.write_dataset(vector_rows(range(20_000)), loc.uri, storage_options=opts)
    ds.create_index("vec", "IVF_PQ", name="vec_idx", num_partitions=64, num_sub_vectors=4)
    lance.dataset(loc.uri, storage_options=opts).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    write_generation(loc, region, range(20_000, 22_000), version=1)
    assert not merge_table(loc.uri).failed_regions
    (result,) = catchup_table(loc.uri).indexes
    assert result.covered and not result.error and result.folded_segments == 0, result
    stats = _dataset(loc).stats.index_stats("vec_idx")
    assert stats["num_unindexed_rows"] == 0
    assert [s["num_partitions"] for s in stats["segments"]] == [64, 64], stats["segments"]
