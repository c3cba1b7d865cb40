"""memwal.fts_statistics: each source's term statistics are kept across snapshots (per immutable dataset
version) and combined per snapshot, minus the rows that are not their key's newest live version in that view.
A cached statistic must never go stale: a new generation shadowing base rows, a tombstone, a delete on the
base, a merge moving rows into the base (with and without index catch-up) and a table recreated at the same
URI each give global BM25 over the new view; and a new snapshot analyses only the new generation and does
not join the whole base's keys."""

from __future__ import annotations

import shutil
import uuid

import lance
import pyarrow as pa
import pytest

from memwal.merge import merge_table
from memwal.reader import LsmReader
from memwal.storage import lance_storage_options

from support.fts_model import assert_ranking, global_bm25
from support.maintenance import flush_generation
from support.tables import PK

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("text", pa.string())])
QUERIES = ["zeta", "quartz", "zeta quartz river"]


def _table(texts: dict[int, str | None]) -> pa.Table:
    ids = sorted(texts)
    return pa.table({"id": pa.array(ids, pa.int64()), "text": pa.array([texts[i] for i in ids], pa.string())},
                    schema=SCHEMA)


def _base_texts(n: int = 40) -> dict[int, str | None]:
    """'zeta' in every base row, 'river' in every third; lengths vary."""
    return {i: " ".join(["zeta", *(["river"] if i % 3 == 0 else []), *(["stone"] * (i % 4))]) for i in range(n)}


def _create(loc, texts: dict[int, str | None]) -> None:
    opts = lance_storage_options(loc.storage_options)
    ds = lance.write_dataset(_table(texts), loc.uri, storage_options=opts)
    ds.create_scalar_index("text", "INVERTED", name="text_idx")
    lance.dataset(loc.uri, storage_options=opts).initialize_mem_wal(unsharded=True)


def _flush(loc, region: str, puts: dict[int, str | None], deletes=()) -> None:
    flush_generation(loc, region, _table(puts) if puts else None, deletes)


def _assert_global_bm25(reader: LsmReader, model: dict, what: str) -> None:
    """Every query ranks as global BM25 over `model` (key -> newest live text; a tuple for a composite key),
    and N is the model's."""
    for query in QUERIES:
        t = reader.full_text_search(query, k=100, columns=list(reader.pk))
        columns = [t.column(c).to_pylist() for c in reader.pk]
        keys = columns[0] if len(columns) == 1 else list(zip(*columns, strict=True))
        assert_ranking(keys, t.column("_score").to_pylist(), global_bm25(model, query), 100, f"{what}, query {query!r}")
    docs = sum(1 for text in model.values() if text and text.split())
    assert reader.last_fts_plan.live_docs == docs, f"{what}: N {reader.last_fts_plan.live_docs}, the view has {docs}"


def test_a_new_generation_shadowing_base_rows_is_subtracted_per_snapshot(local_location):
    """The base's statistics are cached from the first snapshot; a generation then rewrites base rows 0-9 as
    'quartz' and deletes 10-12. The new snapshot subtracts them; the first snapshot still reads its own view."""
    loc = local_location
    model = _base_texts()
    _create(loc, model)
    before = LsmReader(loc.uri)
    _assert_global_bm25(before, model, "base only")
    old = dict(model)
    puts = {i: f"quartz {'quartz ' * (i % 3)}river" for i in range(10)}
    _flush(loc, str(uuid.uuid4()), puts, deletes=range(10, 13))
    model.update(puts)
    for i in range(10, 13):
        del model[i]
    _assert_global_bm25(LsmReader(loc.uri), model, "after a generation shadowing base rows")
    _assert_global_bm25(before, old, "the first snapshot, after the second was read")


def test_a_new_snapshot_analyses_only_the_new_generation_and_joins_no_base_keys(local_location, monkeypatch):
    """After one more flush the next snapshot's first query analyses the new generation's rows only (the base
    and the older generation come from the cache) and finds the base rows it shadows by key lookups, not by a
    join of all the base's keys (the cost of a new snapshot follows what changed)."""
    from memwal import fts_statistics, search_plan

    loc = local_location
    model = _base_texts(60)
    _create(loc, model)
    region = str(uuid.uuid4())
    _flush(loc, region, {i: "quartz" for i in range(5)})
    model.update({i: "quartz" for i in range(5)})
    _assert_global_bm25(LsmReader(loc.uri), model, "warm-up snapshot")

    analysed, joined = [], []
    real_analyze, real_join = fts_statistics.analyze, search_plan.shadowed_in_bulk
    monkeypatch.setattr(fts_statistics, "analyze", lambda texts, config: (analysed.append(len(texts)),
                                                                          real_analyze(texts, config))[1])
    monkeypatch.setattr(search_plan, "shadowed_in_bulk", lambda pk, keys, upper: (joined.append(keys.num_rows),
                                                                                   real_join(pk, keys, upper))[1])
    puts = {i: "quartz zeta" for i in range(5, 8)}
    _flush(loc, region, puts)
    model.update(puts)
    _assert_global_bm25(LsmReader(loc.uri), model, "after one more flush")
    assert not any(n >= 60 for n in joined), f"the whole base's keys were joined ({joined} keys)"
    assert analysed == [3], f"rows analysed for the new snapshot: {analysed} (only the new generation's 3)"


@pytest.mark.parametrize("catch_up", [False, True], ids=["gap", "caught-up"])
def test_a_merge_moving_rows_into_the_base_counts_each_row_once(local_location, catch_up):
    """Snapshot 1: base 0-39, generation 1 rewrites 0-9 and adds 100-109 (both cached). The merge moves them
    into a new base version; without index catch-up generation 1 stays in the view as the gap and shadows its
    merged copies in the base, with catch-up it leaves the view. Either way each live row counts once."""
    from memwal.catchup import catchup_table

    loc = local_location
    model = _base_texts()
    _create(loc, model)
    puts = {**{i: "quartz river" for i in range(10)}, **{i: "quartz zeta zeta" for i in range(100, 110)}}
    _flush(loc, str(uuid.uuid4()), puts)
    model.update(puts)
    _assert_global_bm25(LsmReader(loc.uri), model, "before the merge")
    merge_table(loc.uri)
    if catch_up:
        assert not catchup_table(loc.uri).to_dict()["failed_indexes"]
    reader = LsmReader(loc.uri)
    _assert_global_bm25(reader, model, "after the merge")
    gap = len(reader.sources) == 1 and reader.last_fts_plan.indexed_sources == 2
    assert gap != catch_up, f"the scenario is not the one named: {reader.last_fts_plan.to_dict()}"


def test_a_merge_analyses_only_the_base_fragments_it_added(local_location, monkeypatch):
    """After a merge (a new base version: the merged rows in a new fragment, the rows they replace deleted in
    the old one), the first query analyses the new fragment's rows only: the old fragment's analysis is
    reused without its rows since deleted, and every query is still global BM25 over the view."""
    from memwal import fts_statistics

    loc = local_location
    model = _base_texts(60)
    _create(loc, model)
    region = str(uuid.uuid4())
    puts = {**{i: "quartz river" for i in range(10)}, **{i: "quartz zeta" for i in range(100, 105)}}
    _flush(loc, region, puts, deletes=range(20, 23))
    model.update(puts)
    for i in range(20, 23):
        del model[i]
    _assert_global_bm25(LsmReader(loc.uri), model, "before the merge")
    analysed = []
    real_analyze = fts_statistics.analyze
    monkeypatch.setattr(fts_statistics, "analyze", lambda texts, config: (analysed.append(len(texts)),
                                                                          real_analyze(texts, config))[1])
    merge_table(loc.uri)
    reader = LsmReader(loc.uri)
    _assert_global_bm25(reader, model, "after the merge")
    assert len(lance.dataset(loc.uri).get_fragments()) > 1, "the scenario needs the merge's own fragment"
    assert sum(analysed) == len(puts), f"rows analysed after the merge: {analysed} (the merged {len(puts)} only)"


def test_a_base_keeps_its_two_newest_versions_whole_and_older_snapshots_still_read_their_own(local_location):
    """Every delete on the base makes a version; the process keeps two of them whole (the older ones are put
    together again from the fragments when a reader of that snapshot asks), and each reader's answers stay
    global BM25 over its own view."""
    from memwal import fts_statistics

    loc = local_location
    model = _base_texts(60)
    _create(loc, model)
    readers = []
    for step in range(4):
        readers.append((LsmReader(loc.uri), dict(model)))
        _assert_global_bm25(*readers[-1], f"version {step}")
        lance.dataset(loc.uri, storage_options=lance_storage_options(loc.storage_options)).delete(f"id = {step}")
        del model[step]
    kept = [k for k in fts_statistics._TERMS if k[0][0] == readers[0][0].base.uri]
    assert len(kept) == 2, f"base versions kept whole: {[k[0][1] for k in kept]}"
    for step, (reader, old) in enumerate(readers):
        _assert_global_bm25(reader, old, f"the snapshot of version {step}, asked again")


def test_a_delete_on_the_base_is_a_new_version_read_anew(local_location):
    """A delete committed on the base (a new version) must not be answered from the previous version's terms."""
    loc = local_location
    model = _base_texts()
    _create(loc, model)
    _assert_global_bm25(LsmReader(loc.uri), model, "before the delete")
    lance.dataset(loc.uri, storage_options=lance_storage_options(loc.storage_options)).delete("id < 15")
    for i in range(15):
        del model[i]
    _assert_global_bm25(LsmReader(loc.uri), model, "after a delete on the base")


def test_a_table_recreated_at_the_same_uri_with_the_same_region_is_read_as_itself(local_location):
    """Both tables: a base at the same version and generation 1 of the same region over the same keys; only
    the texts differ. The second's statistics are its own, not the cached first's."""
    loc = local_location
    region = str(uuid.uuid4())
    first = _base_texts()
    _create(loc, first)
    _flush(loc, region, {i: "quartz" for i in range(20)})
    first.update({i: "quartz" for i in range(20)})
    _assert_global_bm25(LsmReader(loc.uri), first, "the first table")
    shutil.rmtree(loc.uri)
    second = {i: "river stone" if i % 2 else "zeta zeta quartz" for i in range(40)}
    _create(loc, second)
    _flush(loc, region, {i: "zeta" for i in range(30, 35)})
    second.update({i: "zeta" for i in range(30, 35)})
    _assert_global_bm25(LsmReader(loc.uri), second, "the recreated table")


def test_a_composite_key_finds_the_shadowed_base_rows_by_the_general_join(local_location):
    """A two-column key (not the integer fast path): generation 1 rewrites base rows (0, 'a')-(9, 'a') as
    'quartz'; the keys (i, 'b') it adds are new. Statistics and ranking are global BM25 of the new view."""
    loc = local_location
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK),
                        pa.field("part", pa.string(), nullable=False, metadata=PK), pa.field("text", pa.string())])

    def table(texts: dict[tuple[int, str], str]) -> pa.Table:
        keys = sorted(texts)
        return pa.table({"id": [k[0] for k in keys], "part": [k[1] for k in keys],
                         "text": [texts[k] for k in keys]}, schema=schema)

    model = {(i, "a"): text for i, text in _base_texts().items()}
    opts = lance_storage_options(loc.storage_options)
    ds = lance.write_dataset(table(model), loc.uri, storage_options=opts)
    ds.create_scalar_index("text", "INVERTED", name="text_idx")
    lance.dataset(loc.uri, storage_options=opts).initialize_mem_wal(unsharded=True)
    _assert_global_bm25(LsmReader(loc.uri), model, "composite key, base only")
    puts = {**{(i, "a"): "quartz" for i in range(10)}, **{(i, "b"): "quartz zeta" for i in range(5)}}
    flush_generation(loc, str(uuid.uuid4()), table(puts))
    model.update(puts)
    reader = LsmReader(loc.uri)
    assert reader.pk == ["id", "part"], reader.pk
    _assert_global_bm25(reader, model, "composite key, after a generation shadowing base rows")


def test_a_kept_dataset_moved_to_another_version_is_not_asked_for_the_old_one(local_location):
    """Later snapshots ask a version through the dataset object its terms were read from (Lance's caches stay
    warm); if that object was moved in place (a delete on it), the snapshot's own object answers instead."""
    from memwal.fts_statistics import source_terms

    loc = local_location
    model = _base_texts()
    _create(loc, model)
    reader = LsmReader(loc.uri)
    _assert_global_bm25(reader, model, "first snapshot")
    terms = source_terms(reader, 0, "text", reader.search_cache[("column", None)][1])
    second = LsmReader(loc.uri)
    assert terms.dataset_for(second.base) is terms.dataset, "the kept dataset object is not reused"
    terms.dataset.delete("id < 5")  # moves the kept object to a new version in place
    assert terms.dataset_for(second.base) is second.base, "a moved dataset object answered for the old version"
    _assert_global_bm25(second, model, "the second snapshot (the old version), after the kept object moved")
    _assert_global_bm25(LsmReader(loc.uri), {k: v for k, v in model.items() if k >= 5}, "after the delete")
