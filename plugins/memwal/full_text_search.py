"""Full-text search over the LSM view (base table, flushed generations, MemTables) with one global BM25.

The sources are the read plan's (memwal.search_plan): the base through its INVERTED index over its indexed
fragments when the gap generations (merged, index not caught up) serve the rest through their own indexes;
each source asked through its own INVERTED index for the rows holding a query term (flat, counted, where it
has none); only each key's newest live version in that view counts (a stale or deleted row neither matches nor counts in
the statistics); the filter is a prefilter on those rows. Scores are Lance's BM25 (k1 1.2, b 0.75, idf
ln(1 + (N - df + 0.5) / (df + 0.5)), a repeated query term counted per occurrence) with the statistics of the
whole live view: N = live rows with at least one term, avgdl = their terms / N, df = live rows holding the term
(kept per source and combined per snapshot: memwal.fts_statistics). Every matching live row is scored, so results
are never short and the ranking is exact.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from memwal.errors import BadInputError
from memwal.fts_statistics import dead_positions, source_terms, view_totals
from memwal.fts_tokenizer import TokenizerConfig, query_terms
from memwal.newest_version import member
from memwal.search_plan import is_inverted_index, plan_sources

if TYPE_CHECKING:
    from collections.abc import Sequence

    from memwal.reader import Filter, LsmReader, Source

__all__ = ["K1", "B", "FtsPlan", "full_text_search"]

K1 = 1.2
B = 0.75
SCORE_COLUMN = "_score"
_ADDR = "_rowaddr"


@dataclass
class FtsPlan:
    """What the last full-text search paid: sources asked through their index, sources and rows read flat."""

    column: str
    terms: list[str]
    indexed_sources: int = 0
    flat_sources: int = 0
    rows_served_flat: int = 0
    candidates: int = 0
    shadowed: int = 0
    live_docs: int = 0
    avg_doc_length: float = 0.0
    doc_frequency: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _resolve_column(reader: LsmReader, column: str | None) -> tuple[str, TokenizerConfig]:
    """The searched column and its tokenizer config, taken from the base table's INVERTED index."""
    table = reader.store.uri
    base_indexes = [d for d in reader.base.describe_indices() if str(d.index_type).upper() == "INVERTED"]
    if column is None:
        columns = sorted({d.field_names[0] for d in base_indexes if len(d.field_names) == 1})
        if len(columns) != 1:
            raise BadInputError(f"table {table}: full_text_search needs column= (INVERTED indexes on "
                                f"{columns or 'no column'})")
        column = columns[0]
    field_ = reader.base.schema.field(column) if column in reader.base.schema.names else None
    if field_ is None or not (pa.types.is_string(field_.type) or pa.types.is_large_string(field_.type)):
        raise BadInputError(f"table {table}: column {column!r} for full_text_search is not a string column")
    desc = next((d for d in base_indexes if list(d.field_names) == [column]), None)
    if desc is None:
        desc = next((d for s in reader.sources[1:] for d in s.dataset.describe_indices()
                     if is_inverted_index(d, column)),
                    None)
    return column, TokenizerConfig.from_index_details(desc.details if desc else None,
                                                      index=desc.name if desc else column)


def _fts(column: str, query: str) -> dict[str, Any]:
    return {"query": query, "columns": [column]}


def _matching(source: Source, column: str, query: str, fast_search: bool) -> np.ndarray:
    """Row addresses of the source's rows (any version) holding a query term, asked through its index (over
    its indexed fragments only with fast_search: the base when the gap generations serve the rest)."""
    t = source.dataset.to_table(full_text_query=_fts(column, query), columns=[], with_row_address=True,
                                fast_search=fast_search, disable_scoring_autoprojection=True)
    return t.column(_ADDR).to_numpy().astype(np.uint64)


def _allowed(source: Source, column: str, query: str, filter: Filter, index: Any | None, pk: Sequence[str],
             fast_search: bool) -> np.ndarray:
    """Row addresses of the source's rows passing the filter (a prefilter of the index search)."""
    ds = source.dataset
    if index is not None:
        t = ds.to_table(full_text_query=_fts(column, query), columns=[pk[0]], filter=filter, prefilter=True,
                        fast_search=fast_search, with_row_address=True, disable_scoring_autoprojection=True)
    else:
        t = ds.to_table(columns=[pk[0]], filter=filter, with_row_address=True)
    return np.sort(t.column(_ADDR).to_numpy().astype(np.uint64))


def bm25(tf: np.ndarray, doc_len: np.ndarray, weights: np.ndarray, avg_doc_length: float) -> np.ndarray:
    """Scores of documents (columns of tf, one row per query term occurrence) given each term's idf weight."""
    norm = K1 * (1.0 - B + B * doc_len / avg_doc_length)
    return (weights[:, None] * (K1 + 1.0) * tf / (tf + norm)).sum(axis=0)


def idf(doc_frequency: int, num_docs: int) -> float:
    """Lance's BM25 idf."""
    return math.log((num_docs - doc_frequency + 0.5) / (doc_frequency + 0.5) + 1.0)


def full_text_search(reader: LsmReader, query: str, *, column: str | None = None, k: int = 10,
                     filter: Filter = None, columns: Sequence[str] | None = None) -> pa.Table:
    """The k live newest rows that best match `query` by global BM25, best first, with `_score`."""
    table = reader.store.uri
    if not isinstance(query, str):
        raise BadInputError(f"table {table}: full_text_search query must be a string, not {type(query).__name__}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise BadInputError(f"table {table}: full_text_search k must be a positive integer, not {k!r}")
    cache = reader.search_cache
    if ("column", column) not in cache:
        cache[("column", column)] = _resolve_column(reader, column)
    column, config = cache[("column", column)]
    columns = list(columns) if columns is not None else [f.name for f in reader.base.schema]
    missing = [c for c in columns if c not in reader.base.schema.names]
    if missing:
        raise BadInputError(f"table {table}: full_text_search columns {missing} are not in the table")
    out_schema = reader.output_schema(columns).append(pa.field(SCORE_COLUMN, pa.float32()))
    terms = query_terms(query, config)
    plan = FtsPlan(column, terms)
    reader.last_fts_plan = plan
    if not terms:
        return out_schema.empty_table()

    # The read plan over the whole view (the statistics are the view's whatever the filter): the base over its
    # indexed fragments when the gap generations serve the rest, those generations through their own indexes.
    planned = plan_sources(reader, column, is_inverted_index)
    view = planned[0].view if planned else ()
    unique = sorted(set(terms))
    totals = []  # per source: its terms and dead rows (memwal.fts_statistics), for the view's statistics
    found = []  # (planned source, addresses, row ids, tf (unique terms x rows), doc lengths)
    for p in planned:
        terms_of = source_terms(reader, p.position, column, config)
        # The same version through the dataset object its terms were read from (Lance's caches stay warm).
        source, index = replace(p.source, dataset=terms_of.dataset_for(p.source.dataset)), p.index
        p = replace(p, source=source)
        dead = dead_positions(reader, p.position, terms_of, view)
        totals.append((terms_of, dead))
        tf_all = np.stack([terms_of.tf(t) for t in unique])
        if index is None:
            plan.flat_sources += 1
            plan.rows_served_flat += len(terms_of.addrs)
            pos = np.nonzero(tf_all.any(axis=0))[0]
        else:
            plan.indexed_sources += 1
            plan.rows_served_flat += p.unindexed_rows
            pos = np.sort(terms_of.positions(_matching(source, column, query, p.fast_search)))
        plan.candidates += len(pos)
        keep = ~member(pos, dead)
        plan.shadowed += int((~keep).sum())
        pos = pos[keep]
        if len(pos):
            found.append((p, terms_of.addrs[pos], terms_of.row_ids[pos], tf_all[:, pos], terms_of.lengths[pos]))
    if ("fts totals", column, config) not in cache:  # the view's, whatever the query: once per snapshot
        cache[("fts totals", column, config)] = view_totals(totals)
    view_stats = cache[("fts totals", column, config)]
    total_terms, live_docs = view_stats.terms, view_stats.docs
    plan.live_docs = live_docs
    if not found or live_docs == 0:
        return out_schema.empty_table()
    avg = total_terms / live_docs
    plan.avg_doc_length = avg
    df = sum((f[3] > 0).sum(axis=1) for f in found)
    plan.doc_frequency = {t: int(n) for t, n in zip(unique, df, strict=True)}
    # One weight per query term occurrence (a repeated term counts twice, as in Lance).
    position = {t: j for j, t in enumerate(unique)}
    rows = [position[t] for t in terms]
    weights = np.array([idf(int(df[j]), live_docs) if df[j] else 0.0 for j in rows])

    regions = reader.regions_for(filter)
    parts = []  # per source: scores, generation, addresses, source index, row ids of its matching rows
    for p, addrs, ids, tf, lengths in found:
        i, source = p.position, p.source
        if regions is not None and source.region_id is not None and source.region_id not in regions:
            continue
        scores = bm25(tf[rows].astype(np.float64), lengths.astype(np.float64), weights, avg)
        keep = scores > 0
        if filter is not None:
            keep &= member(addrs, _allowed(source, column, query, filter, p.index, reader.pk, p.fast_search))
        n = int(keep.sum())
        parts.append((scores[keep], np.full(n, source.generation), addrs[keep], np.full(n, i), ids[keep]))
    if not parts:
        return out_schema.empty_table()
    scores, gens, addrs, srcs, ids = (np.concatenate(c) for c in zip(*parts, strict=True))
    # Best first; ties: the newer generation, then the later row (a deterministic order).
    order = np.lexsort((np.iinfo(np.uint64).max - addrs, -gens, -scores))[:k]
    top = [(float(scores[j]), int(gens[j]), int(addrs[j]), int(srcs[j]), int(ids[j])) for j in order]
    if not top:
        return out_schema.empty_table()
    warm = {f[0].position: f[0].source.dataset for f in found}
    by_source: dict[int, list[int]] = {}
    for s in top:
        by_source.setdefault(s[3], []).append(s[4])
    fetched = {}
    for i, ids in by_source.items():
        ids = sorted(ids)  # in row id order, so the rows come back in this order even if Lance sorts them
        t = warm[i]._take_rows(ids, columns=columns)
        fetched[i] = dict(zip(ids, range(t.num_rows), strict=True)), t.cast(reader.output_schema(columns))
    parts = [fetched[s[3]][1].slice(fetched[s[3]][0][s[4]], 1) for s in top]
    result = pa.concat_tables(parts).combine_chunks()
    return result.append_column(pa.field(SCORE_COLUMN, pa.float32()),
                                pa.array([s[0] for s in top], pa.float32()))

