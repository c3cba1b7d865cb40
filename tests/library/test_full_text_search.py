"""LsmReader.full_text_search: one global BM25 over the LSM view (base, merged-but-not-caught-up generations,
unmerged generations, MemTables), newest live versions only, filter as a prefilter, never short, compared with
a pure-Python model (tests/fts_model.py) and, on a plain base table, with Lance's own FTS."""

from __future__ import annotations

import uuid

import lance
import pyarrow as pa
import pytest

from memwal.errors import BadInputError
from memwal.merge import merge_table
from memwal.reader import LsmReader
from memwal.storage import lance_storage_options

from support.fts_model import assert_ranking, global_bm25
from support.lance_core_writes import write_through_lance_core
from support.maintenance import flush_generation
from support.memtable_views import reader_with_memtable
from support.tables import PK

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False, metadata=PK),
    pa.field("text", pa.string()),
    pa.field("grp", pa.int64()),
])
FILLER = ["river", "stone", "cloud", "ember", "maple", "violet", "running", "runners", "the", "over", "café"]


def base_text(i: int) -> str:
    """Skewed: 'zeta' in every other base row, 'quartz' in one in 40; lengths vary with i."""
    words = [FILLER[(i + j) % len(FILLER)] for j in range(1 + i % 6)]
    if i % 2 == 0:
        words.append("zeta")
    if i % 40 == 0:
        words.append("quartz")
    return " ".join(words)


def new_text(i: int, v: int) -> str:
    """Skewed the other way: 'quartz' in most rows written later, 'zeta' in one in 10."""
    words = [FILLER[(i * 3 + v + j) % len(FILLER)] for j in range(1 + (i + v) % 4)]
    words.append("quartz quartz" if i % 3 == 0 else "quartz")
    if i % 10 == 0:
        words.append("zeta")
    return " ".join(words)


def table_of(texts: dict[int, str | None]) -> pa.Table:
    ids = sorted(texts)
    return pa.table({"id": pa.array(ids, pa.int64()), "text": pa.array([texts[i] for i in ids], pa.string()),
                     "grp": pa.array([i % 3 for i in ids], pa.int64())}, schema=SCHEMA)


def create_base(loc, texts: dict[int, str | None]) -> None:
    opts = lance_storage_options(loc.storage_options)
    ds = lance.write_dataset(table_of(texts), loc.uri, storage_options=opts)
    ds.create_scalar_index("text", "INVERTED", name="text_idx")
    lance.dataset(loc.uri, storage_options=opts).initialize_mem_wal(unsharded=True)


def flush(loc, region: str, puts: dict[int, str | None], deletes=()) -> None:
    flush_generation(loc, region, table_of(puts) if puts else None, deletes)


@pytest.fixture
def lsm(local_location):
    """The LSM view and its model:

    | level                                    | rows                                                   |
    | base (INVERTED index)                    | ids 0-399, 'zeta' common, 'quartz' rare                |
    | generation 1, merged, index not caught up| ids 400-439 new, 100-119 updated (unindexed base rows) |
    | generation 2, unmerged                   | ids 0-59 updated (text changes), 60-69 deleted,        |
    |                                          | 1000-1019 new: 'quartz' common, 'zeta' rare            |
    | MemTable                                 | ids 1000-1004 updated, 2000-2004 new, 70 deleted       |
    """
    loc = local_location
    model = {i: base_text(i) for i in range(400)}
    create_base(loc, model)
    region = str(uuid.uuid4())
    gen1 = {**{i: new_text(i, 1) for i in range(400, 440)}, **{i: new_text(i, 1) for i in range(100, 120)}}
    flush(loc, region, gen1)
    merge_table(loc.uri)
    model.update(gen1)
    gen2 = {**{i: new_text(i, 2) for i in range(0, 60)}, **{i: new_text(i, 2) for i in range(1000, 1020)}}
    gen2[5] = None  # an update to a null text: the row stops matching and counts no terms
    flush(loc, region, gen2, deletes=range(60, 70))
    model.update(gen2)
    for i in range(60, 70):
        del model[i]
    mem = {**{i: new_text(i, 3) for i in range(1000, 1005)}, **{i: new_text(i, 3) for i in range(2000, 2005)}}
    with reader_with_memtable(loc, region, mem, [70], model, table_of) as reader:
        yield reader, model


def _ours(reader: LsmReader, query: str, k: int, **kw) -> tuple[list[int], list[float]]:
    t = reader.full_text_search(query, k=k, **kw)
    return t.column("id").to_pylist(), t.column("_score").to_pylist()


@pytest.mark.parametrize("query", ["zeta", "quartz", "zeta quartz", "running river café", "quartz quartz zeta"])
@pytest.mark.parametrize("k", [10, 1000])
def test_scores_are_one_global_bm25_over_the_lsm_view(lsm, query, k):
    reader, model = lsm
    keys, scores = _ours(reader, query, k)
    assert_ranking(keys, scores, global_bm25(model, query), k, f"query {query!r}, k={k}")


def test_per_source_bm25_ranks_this_data_differently(lsm):
    """The skew is real: ranking each source by its own BM25 statistics (as LanceDB's LSM FTS does) gives a
    different top 10 than the global BM25 our search returns, so the test above would fail with it."""
    reader, model = lsm
    query = "zeta quartz"
    live = set(model)
    per_source: dict[int, float] = {}
    newest: dict[int, int] = {}
    for src in sorted(reader.sources, key=lambda s: s.generation):
        texts = {r["id"]: r["text"] for r in src.dataset.to_table(columns=["id", "text"]).to_pylist()}
        for key, score in global_bm25(texts, query).items():
            if key in live:
                per_source[key], newest[key] = score, src.generation
    scores = global_bm25(model, query)
    want = sorted(scores, key=lambda key: -scores[key])[:10]
    local = sorted(per_source, key=lambda key: -per_source[key])[:10]
    assert set(local) != set(want), "per-source BM25 ranks like global BM25 on this data: the skew is too weak"
    keys, _ = _ours(reader, query, 10)
    assert len(set(keys) & set(want)) == 10, "our top 10 is not global BM25's top 10"


def test_stale_deleted_and_null_versions_never_match(lsm):
    """Base row 0 ('... zeta') was updated in generation 2; 60-69 were deleted there, 70 in the MemTable;
    row 5's newest text is null: none of their old texts may match, no key comes back twice."""
    reader, model = lsm
    keys, _ = _ours(reader, "zeta quartz river stone cloud ember maple violet", 5000)
    assert len(keys) == len(set(keys)), "a key came back twice"
    assert not {*range(60, 71), 5} & set(keys), "a deleted key or a row whose newest text is null matched"
    for key in (0, 2, 100, 1000):
        got = reader.full_text_search(model[key], k=5000, columns=["id", "text"]).to_pylist()
        assert {r["text"] for r in got if r["id"] == key} == {model[key]}, f"key {key}: not its newest text"


@pytest.mark.parametrize("filter", ["grp = 1", "id >= 1000", "grp = 2 AND id < 500"])
def test_filter_is_a_prefilter_on_the_newest_versions(lsm, filter):
    reader, model = lsm
    allowed = {
        "grp = 1": lambda i: i % 3 == 1,
        "id >= 1000": lambda i: i >= 1000,
        "grp = 2 AND id < 500": lambda i: i % 3 == 2 and i < 500,
    }[filter]
    query = "zeta quartz"
    scores = global_bm25(model, query)  # statistics of the whole view, whatever the filter
    keys, got = _ours(reader, query, 10, filter=filter)
    assert_ranking(keys, got, {k: s for k, s in scores.items() if allowed(k)}, 10, f"filter {filter!r}")


def test_plan_counts_indexed_and_flat_sources(lsm):
    """The spec's read plan: the base through its INVERTED index over its indexed fragments only; generation 1
    (merged, index not caught up: the gap) and generation 2 through the INVERTED indexes their flush built;
    the MemTable has none and is read flat (its 11 rows: the only rows served flat); all are counted."""
    reader, _ = lsm
    reader.full_text_search("quartz")
    plan = reader.last_fts_plan
    assert plan.indexed_sources == 3 and plan.flat_sources == 1, plan.to_dict()
    assert plan.rows_served_flat == 11, "the gap's 60 base rows should be served by generation 1's own index"
    assert plan.shadowed > 0, "the updated base rows holding 'quartz' should be seen and dropped as stale"


def test_the_gap_is_served_by_the_gap_generation_and_the_base_fast_searched(lsm, monkeypatch):
    """Lance is asked for the base's matches over its indexed fragments only (fast_search) and for generation
    1's through its own index; the scores stay one global BM25 (test above)."""
    from memwal import full_text_search as fts

    asked = []
    real = fts._matching

    def spy(source, column, query, fast_search):
        asked.append((source.generation, fast_search))
        return real(source, column, query, fast_search)

    monkeypatch.setattr(fts, "_matching", spy)
    reader, model = lsm
    keys, scores = _ours(reader, "quartz zeta", 1000)
    assert_ranking(keys, scores, global_bm25(model, "quartz zeta"), 1000, "with the gap generation")
    assert sorted(asked) == [(0, True), (1, False), (2, False)], asked


def test_scores_match_lance_fts_on_a_plain_base_table(local_location):
    """No LSM levels: our scores are Lance's own FTS scores (same analysis, same BM25), same order."""
    texts = {i: base_text(i) for i in range(300)}
    texts.update({300: None, 301: "", 302: "the over of", 303: "Straße NAÏVE résumé flying flies hello-world"})
    create_base(local_location, texts)
    reader = LsmReader(local_location.uri)
    ds = reader.base
    for query in ["zeta", "quartz zeta", "river running", "cafe", "flies", "naive resume strasse", "hello"]:
        lance_t = ds.to_table(full_text_query={"query": query, "columns": ["text"]}, columns=["id", "_score"])
        ours = reader.full_text_search(query, k=1000, columns=["id"])
        lance_scores = dict(zip(lance_t.column("id").to_pylist(), lance_t.column("_score").to_pylist(),
                                strict=True))
        assert_ranking(ours.column("id").to_pylist(), ours.column("_score").to_pylist(), lance_scores, 1000,
                       f"query {query!r} against Lance's FTS")


def test_no_term_and_no_match_give_an_empty_result(lsm):
    reader, _ = lsm
    for query in ["", "the of and", "nonexistentword"]:
        t = reader.full_text_search(query, columns=["id"])
        assert t.num_rows == 0 and t.schema.names == ["id", "_score"], query


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"k": 0}, "k must be a positive integer"),
    ({"column": "grp"}, "not a string column"),
    ({"column": "nope"}, "not a string column"),
    ({"columns": ["nope"]}, "not in the table"),
])
def test_bad_arguments_are_refused_naming_the_parameter(lsm, kwargs, message):
    reader, _ = lsm
    with pytest.raises(BadInputError, match=message):
        reader.full_text_search("zeta", **kwargs)


def test_stop_words_and_stems_are_lances(local_location):
    """Each stop word, and common words that are not, is indexed by Lance exactly when our analysis keeps a
    term of it (stop words are checked after stemming, as in Lance: 'having' stems to the stop word 'have')."""
    from memwal.fts_tokenizer import _ENGLISH_STOP_WORDS, TokenizerConfig, query_terms

    others = ["having", "does", "doing", "over", "house", "lying", "us", "whose", "no", "mr", "also", "said", "one",
              "would", "could", "cannot", "not", "ought", "nor", "would've", "ours", "yourselves"]
    words = [*sorted(_ENGLISH_STOP_WORDS), *others]
    create_base(local_location, {i: w for i, w in enumerate(words)})
    ds = LsmReader(local_location.uri).base
    config = TokenizerConfig.from_index_details(ds.describe_indices()[0].details)
    for i, w in enumerate(words):
        hits = ds.to_table(full_text_query={"query": w, "columns": ["text"]}, columns=["id"]).column("id")
        assert (i in hits.to_pylist()) == bool(query_terms(w, config)), \
            f"{w!r}: Lance {'indexes' if len(hits) else 'drops'} it, our analysis gives {query_terms(w, config)}"


def test_generations_lance_core_flushed_are_searched_through_their_fts_index(local_location):
    """Lance core's ShardWriter flushes generations holding the maintained INVERTED index:

    | level                      | rows                                                        |
    | base                       | ids 0-199, 'zeta' common                                    |
    | Lance core generations     | ids 0-39 updated, 200-259 new ('quartz' common), 5-9 deleted |
    Our search asks those generations through their own index and still scores with one global BM25."""
    loc = local_location
    model = {i: base_text(i) for i in range(200)}
    opts = lance_storage_options(loc.storage_options)
    ds = lance.write_dataset(table_of(model), loc.uri, storage_options=opts)
    ds.create_scalar_index("text", "INVERTED", name="text_idx")
    ds = lance.dataset(loc.uri, storage_options=opts)
    ds.initialize_mem_wal(maintained_indexes=["text_idx"], unsharded=True)
    puts = [{i: new_text(i, 1) for i in range(0, 40)}, {i: new_text(i, 2) for i in range(200, 260)}]
    write_through_lance_core(loc.uri, opts, puts, range(5, 10), model, table_of)
    reader = LsmReader(loc.uri)
    generations = reader.sources[1:]
    assert len(generations) >= 2, "the scenario must span several Lance core generations"
    assert all(any(str(d.index_type).upper() == "INVERTED" for d in g.dataset.describe_indices())
               for g in generations), "Lance core flushed a generation without the maintained FTS index"
    for query in ["zeta quartz", "quartz", "river café"]:
        keys, scores = _ours(reader, query, 20)
        assert_ranking(keys, scores, global_bm25(model, query), 20, f"query {query!r}")
        assert reader.last_fts_plan.indexed_sources == len(reader.sources), reader.last_fts_plan.to_dict()


def test_generations_lancedb_flushed_are_searched_with_global_bm25(local_location):
    """LanceDB (its own Lance 13) flushes two rounds of generations with its FTS index maintained:

    | level               | rows                                     |
    | base                | ids 0-39 ('base-i')                      |
    | LanceDB round 1     | ids 0-14 updated ('r1-i'), 40-59 new     |
    | LanceDB round 2     | ids 10-24 updated ('r2-i')               |
    Our search over its files equals global BM25 over the newest texts."""
    from support.lancedb_peer import LanceDbTable
    from support.lancedb_peer import rows as peer_rows
    from support.vector_model import text_of

    peer = LanceDbTable(local_location)
    peer.create("unsharded", base_ids=range(40), vector=True)
    peer.write_round([peer_rows([*range(15), *range(40, 60)], "r1", vector=True)])
    peer.write_round([peer_rows(range(10, 25), "r2", vector=True)])
    model = {k: text_of(r["val"]) for k, r in peer.model.items()}
    reader = LsmReader(peer.table.uri)
    assert len(reader.sources) >= 3, "the scenario must span LanceDB's generations"
    words = sorted({w for t in model.values() for w in t.split() if "-" not in w})
    assert words, "the texts hold no shared words"
    for query in [words[0], " ".join(words[:3]), "r2"]:
        keys, scores = _ours(reader, query, 15)
        assert_ranking(keys, scores, global_bm25(model, query), 15, f"query {query!r}")
        assert reader.last_fts_plan.indexed_sources == len(reader.sources), \
            f"LanceDB's generations carry its FTS index and are searched through it: {reader.last_fts_plan}"


def test_filter_may_be_a_pyarrow_expression(lsm):
    import pyarrow.compute as pc

    reader, model = lsm
    scores = global_bm25(model, "quartz")
    keys, got = _ours(reader, "quartz", 10, filter=pc.field("grp") == 1)
    assert_ranking(keys, got, {k: s for k, s in scores.items() if k % 3 == 1}, 10, "filter grp == 1 (expression)")
