"""The model-based machine (machine.py) on a table with a vector index (IVF_PQ, 2 partitions, its metric drawn
per sequence: l2, cosine or dot) and a full-text index (INVERTED) beside its BTREE, all maintained by the
machine's jobs: catch-up with the default IndexPolicy (segments folded past the bound, or, with a compaction
due at 2 small fragments, when they would block it), compaction, retention, snapshot and GC.

Every row's vector and text are functions of its name (tests/support/vector_model.py; about one written row
in four has a null vector: `nullable_vector_of`), so the machine's model (key -> name, score) is the model of
the searches too. After every step, through Lance on the base table:
an exact vector search (no index) equals the full ordered brute-force result, an ANN search with every
partition probed and refinement over all rows returns the brute-force nearest rows, the FTS query of every
word and two scalar filters return the brute-force rows; our full-text search over the LSM view (with the
MemTables) equals global BM25 over its newest texts; our vector search over it, every partition probed and
refined over all rows, equals the brute-force newest-wins nearest rows, and at its defaults returns live
newest rows, never short; no index has more segments than the policy's bound. A rule searches over the
LSM view with a drawn filter and k (null vectors are never results). The base table the searches run on is
a plain scan: its vectors and texts must be those of its names, and once every flushed generation is merged
it must equal our LSM view (which the reads compare with the model). At the end (everything merged and
caught up) the indexes cover every row.
"""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

import lance
import numpy as np
import pyarrow as pa
from hypothesis import strategies as st
from hypothesis.stateful import INITIALIZE_RULE_MARKER, initialize, invariant, precondition, rule
from machine import LsmMachine, _tracked, local_machine

from memwal.catchup import catchup_table
from memwal.compaction import compact_table
from memwal.index_segments import segment_counts
from memwal.maintenance_config import DEFAULT_MAX_INDEX_SEGMENTS, CompactionConfig
from memwal.merge import merge_table
from memwal.reader import LsmReader
from memwal.storage import lance_storage_options
from memwal.table import MemWalTable

from support.fts_model import assert_ranking, global_bm25
from support.tables import SCHEMA, Row, view
from support.vector_model import (
    ANN_K,
    DIM,
    IVF_PQ_PARAMS,
    METRICS,
    PARTITIONS,
    QUERIES,
    WORDS,
    Vector,
    assert_top_k,
    check_lance_searches,
    distance,
    nullable_vector_of,
    text_of,
    vector_column,
    vector_of,
)

VECTOR_INDEX, FTS_INDEX = "vec_idx", "text_idx"
DUE_AT_TWO = CompactionConfig(max_small_fragments=2)
VECTOR_SCHEMA = pa.schema([*SCHEMA, pa.field("text", pa.string()), pa.field("vec", pa.list_(pa.float32(), DIM))])


def vector_table(vals: list[tuple[int, Row]], vector: Vector = vector_of) -> pa.Table:
    """Rows of VECTOR_SCHEMA for (key, (name, score)) pairs: text and vector (`vector`) derived from the name."""
    names = [v[0] for _, v in vals]
    return pa.table({"id": [k for k, _ in vals], "name": names, "score": [v[1] for _, v in vals],
                     "text": [text_of(n) for n in names], "vec": vector_column(names, vector)}, schema=VECTOR_SCHEMA)


def create_vector_indexes(ds: lance.LanceDataset, metric: str = "l2") -> None:
    ds.create_index("vec", "IVF_PQ", name=VECTOR_INDEX, metric=metric, **IVF_PQ_PARAMS)
    ds.create_scalar_index("text", "INVERTED", name=FTS_INDEX)


class Where:
    """A drawn search filter: its SQL, and the same test on a model row (key, name, score)."""

    def __init__(self, sql: str, test) -> None:
        self.sql, self.test = sql, test

    def __repr__(self) -> str:  # hypothesis prints the SQL of a failing draw
        return repr(self.sql)

    def __and__(self, other: Where) -> Where:
        return Where(f"({self.sql}) AND ({other.sql})", lambda *row: self.test(*row) and other.test(*row))


def _has_vector(name: str) -> bool:
    return nullable_vector_of(name) is not None


_TERMS = st.one_of(
    st.integers(0, 8).map(lambda n: Where(f"id < {n}", lambda k, name, score: k < n)),
    st.integers(0, 8).map(lambda n: Where(f"id >= {n}", lambda k, name, score: k >= n)),
    st.lists(st.integers(0, 11), min_size=1, max_size=3).map(
        lambda ks: Where(f"id IN ({', '.join(map(str, ks))})", lambda k, name, score: k in ks)),
    st.sampled_from([Where("score >= 0", lambda k, name, score: score >= 0),
                     Where("vec IS NULL", lambda k, name, score: not _has_vector(name)),
                     Where("vec IS NOT NULL", lambda k, name, score: _has_vector(name))]),
)
FILTERS = st.one_of(st.none(), _TERMS, st.builds(lambda a, b: a & b, _TERMS, _TERMS))
# The base machine's setup draws (hypothesis records them on the rule): the vector machine adds the metric.
_SETUP_ARGUMENTS = getattr(LsmMachine.setup, INITIALIZE_RULE_MARKER).arguments


class VectorLsmMachine(LsmMachine):
    # 12 rows outside the written keys: with the 4 base keys, the 16 rows IVF_PQ trains on.
    static_keys: ClassVar[range] = range(100, 112)
    draw_schemas: ClassVar[bool] = False  # its rows carry text and vector columns of their own
    metric = "l2"

    @initialize(metric=st.sampled_from(METRICS), **_SETUP_ARGUMENTS)
    def setup(self, metric: str, **drawn) -> None:
        """The base machine's setup, the vector index of the drawn metric."""
        self.metric = metric
        super().setup(**drawn)

    def _table(self, vals: list[tuple[int, Row]]) -> pa.Table:
        table = vector_table(vals, nullable_vector_of)
        type(self).stats["null_vectors_written"] += table.column("vec").null_count
        return table

    def _create_indexes(self, ds: lance.LanceDataset) -> None:
        create_vector_indexes(ds, self.metric)

    def _all_merged(self) -> bool:
        merged = self._check_merged_monotonic()
        return all(merged.get(r, 0) == self._highest_flushed(ri)
                   for ri, r in enumerate(self.regions) if self._has_manifest(ri))

    def _check_searches(self, what: str) -> lance.LanceDataset:
        ds = lance.dataset(self.uri, storage_options=lance_storage_options(self.so))
        base = ds.to_table(columns=["id", "name", "score", "text", "vec"])
        for r in base.to_pylist():
            want = nullable_vector_of(r["name"])
            assert r["text"] == text_of(r["name"]) and (r["vec"] is None if want is None else
                                                         np.array_equal(r["vec"], want)), \
                f"{what}: base row {r['id']} holds another row's vector or text"
        rows = view(base)
        if self._all_merged():
            assert rows == self._lsm(False), f"{what}: the fully merged base table differs from the LSM view"
        check_lance_searches(ds, {k: v[0] for k, v in rows.items()}, {k: v[1] for k, v in rows.items()},
                             VECTOR_INDEX, FTS_INDEX, what, self.metric, nullable_vector_of)
        segments = segment_counts(ds)
        assert max(segments.values()) <= DEFAULT_MAX_INDEX_SEGMENTS, f"{what}: segments over the bound: {segments}"
        type(self).stats["max_vector_segments"] = max(type(self).stats["max_vector_segments"], segments[VECTOR_INDEX])
        return ds

    @precondition(lambda self: self._any_region())
    @rule(merge_first=st.booleans(), then_compact=st.booleans())
    @_tracked
    def catch_up_before_compaction(self, merge_first: bool, then_compact: bool) -> None:
        """(Merge ->) catch-up (-> compaction) as the maintenance DAG runs them on a table whose compaction is
        due at 2 small fragments: with the default IndexPolicy catch-up folds the segments that would block
        that compaction, so the compaction can combine the fragments. Neither changes the LSM view."""
        if merge_first:
            assert not merge_table(MemWalTable(self.uri, self.so), dedup=self.dedup).failed_regions
            self._check_merged_monotonic()
        before = self._lsm(False)
        summary = catchup_table(MemWalTable(self.uri, self.so), compaction=DUE_AT_TWO)
        assert all(i.error is None and i.covered for i in summary.indexes), summary
        type(self).stats["folded_segments"] += sum(i.folded_segments for i in summary.indexes)
        if then_compact:
            compacted = compact_table(MemWalTable(self.uri, self.so), DUE_AT_TWO)
            assert compacted.error is None, compacted.to_dict()
            type(self).stats["dag_compaction_tasks"] += compacted.tasks_committed
        assert self._lsm(False) == before, "catch-up or compaction changed the LSM view"
        self._check_merged_monotonic()

    def _check_lsm_full_text_search(self, what: str) -> None:
        """Our full-text search over the LSM view with the live MemTables (merged-but-not-caught-up rows,
        unmerged generations, MemTables) equals global BM25 over that view's newest texts, with and without a
        filter (the view itself is checked against the model by the read rule)."""
        reader = LsmReader(MemWalTable(self.uri, self.so), memtables=self._memtables())
        texts = {k: text_of(v[0]) for k, v in view(reader.scan()).items()}
        for query in (*WORDS, f"{WORDS[0]} {WORDS[3]} {WORDS[3]}"):
            for filter, keep in ((None, lambda k: True), ("id < 20", lambda k: k < 20)):
                got = reader.full_text_search(query, k=5, filter=filter, columns=["id"])
                model = {k: s for k, s in global_bm25(texts, query).items() if keep(k)}
                assert_ranking(got.column("id").to_pylist(), got.column("_score").to_pylist(), model, 5,
                               f"{what}: LSM full-text search {query!r} (filter {filter})")
        type(self).stats["lsm_fts_checks"] += 1

    def _check_lsm_vector_search(self, what: str) -> None:
        """Our vector search over the LSM view with the live MemTables: with every partition probed and
        refinement over all rows it equals the brute-force newest-wins nearest rows (with and without a filter);
        at the defaults its rows are live newest versions, each key once, never short."""
        reader = LsmReader(MemWalTable(self.uri, self.so), memtables=self._memtables())
        names = {k: v[0] for k, v in view(reader.scan()).items()}
        for qi, q in enumerate(QUERIES):
            for filter, keep in ((None, lambda k: True), ("id < 20", lambda k: k < 20)):
                kept = {k: n for k, n in names.items() if keep(k)}
                got = reader.search(q, k=ANN_K, filter=filter, columns=["id", "name"], nprobes=PARTITIONS,
                                    refine_factor=len(names) + 1)
                pairs = list(zip(got.column("_distance").to_pylist(), got.column("id").to_pylist(), strict=True))
                assert_top_k(pairs, kept, q, ANN_K, f"{what}: LSM vector search {qi} ({filter})", self.metric,
                             nullable_vector_of)
            self._check_ann(reader, names, q, ANN_K, None, f"{what}: LSM ANN search {qi}")
        type(self).stats["lsm_vector_checks"] += 1

    def _check_ann(self, reader: LsmReader, names: dict[int, str], q: np.ndarray, k: int, filter: str | None,
                   what: str) -> None:
        """At the defaults: live newest rows with a vector, each key once, never short (`names`: the rows
        passing the filter; those with a distance to q count: not a null vector, nor any under cosine to q = 0)."""
        ann = reader.search(q, k=k, filter=filter, columns=["id", "name"]).to_pylist()
        eligible = sum(distance(nullable_vector_of(n), q, self.metric) is not None for n in names.values())
        assert len(ann) == min(k, eligible), f"{what} is short: {ann}"
        assert len({r["id"] for r in ann}) == len(ann) and all(names.get(r["id"]) == r["name"] for r in ann), \
            f"{what} returned a stale, deleted, repeated or filtered-out row: {ann}"
        assert all(_has_vector(r["name"]) for r in ann), f"{what} returned a row with a null vector: {ann}"

    @precondition(lambda self: self.loc is not None)
    @rule(where=FILTERS, k=st.sampled_from([1, ANN_K, 40]), qi=st.integers(0, len(QUERIES) - 1))
    @_tracked
    def search_vectors(self, where: Where | None, k: int, qi: int) -> None:
        """Our vector search over the LSM view (with the live MemTables) with a drawn filter and k: every
        partition probed and refined over all rows, it equals the brute-force newest-wins search over the rows
        passing the filter (null vectors never results); at the defaults it is never short."""
        reader = LsmReader(MemWalTable(self.uri, self.so), memtables=self._memtables())
        rows = view(reader.scan())
        kept = {key: v[0] for key, v in rows.items() if where is None or where.test(key, *v)}
        sql, q = None if where is None else where.sql, QUERIES[qi]
        got = reader.search(q, k=k, filter=sql, columns=["id", "name"], nprobes=PARTITIONS,
                            refine_factor=len(rows) + 1)
        pairs = list(zip(got.column("_distance").to_pylist(), got.column("id").to_pylist(), strict=True))
        assert_top_k(pairs, kept, q, k, f"LSM vector search {qi}, k={k}, filter {sql}", self.metric,
                     nullable_vector_of)
        self._check_ann(reader, kept, q, k, sql, f"LSM ANN search {qi}, k={k}, filter {sql}")
        type(self).stats["drawn_vector_searches"] += 1

    @invariant()
    @_tracked
    def searches_equal_model(self) -> None:
        if self.loc is not None:
            self._check_searches("after a step")
            self._check_lsm_full_text_search("after a step")
            self._check_lsm_vector_search("after a step")

    def _final_check(self) -> None:
        super()._final_check()
        ds = self._check_searches("at the end")
        for name in (VECTOR_INDEX, FTS_INDEX):
            stats = ds.stats.index_stats(name)
            assert stats["num_unindexed_rows"] == 0, f"{name} leaves rows unindexed after the final catch-up: {stats}"


def local_vector_machine(root: str | None = None) -> type[VectorLsmMachine]:
    """The vector machine on fresh directories under root (a new temporary directory if None)."""
    local = local_machine(root)
    return type("LocalVectorLsmMachine", (VectorLsmMachine,), {
        "new_location": staticmethod(local.new_location), "cleanup_location": staticmethod(local.cleanup_location),
        "stats": Counter()})
