"""Vector search over the LSM view (base table, flushed generations, MemTables): the k nearest live newest rows.

Every source of the read plan (memwal.search_plan) is asked through its own vector index, with the filter as a
prefilter; a source without one, or a generation or MemTable small enough (FLAT_ROWS), is searched flat, so
a generation's index type never makes the result less exact than the base table's own search. A candidate
counts only if it is its key's newest live version; a source whose candidates were shadowed is asked for more
until k live rows are found or it is exhausted (never short). Candidates are re-ranked by exact distances
computed from their vectors. A row whose distance is undefined (a null vector; a zero vector under cosine) is
never a result, as in Lance.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from memwal.errors import BadInputError
from memwal.newest_version import NewerCheck
from memwal.search_plan import (
    View,
    index_partitions,
    is_live,
    is_vector_index,
    plan_sources,
    source_at,
    source_rows,
    upper_positions,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from memwal.reader import Filter, LsmReader

__all__ = ["DISTANCE_COLUMN", "FLAT_ROWS", "VectorPlan", "default_nprobes", "first_ask", "vector_search"]

DISTANCE_COLUMN = "_distance"
# Generations and MemTables of at most this many rows are searched flat (exact), whatever index they carry.
FLAT_ROWS = 20_000
# When the caller gives none: partitions probed and refinement of an indexed source (the base table). nprobes
# scales with the index's partitions (default_nprobes): a fixed 20 gave recall@10 0.73-0.79 from 316 to 1,000
# partitions on bench/search.py's data; 64 reached 0.95 at 316 and 500 (bench/README.md).
MIN_NPROBES = 80
NPROBES_FRACTION = 0.1
DEFAULT_REFINE_FACTOR = 10
_METRICS = ("l2", "cosine", "dot")


@dataclass
class VectorPlan:
    """What the last vector search paid: sources asked through an index or flat, rows served flat, candidates
    read, how many were shadowed (stale, deleted or duplicate versions) and the extra rounds that cost; for base
    candidates, the (key, generation) pairs a bloom filter ruled out and those checked against keys."""

    column: str
    metric: str
    indexed_sources: int = 0
    flat_sources: int = 0
    rows_served_flat: int = 0
    candidates: int = 0
    shadowed: int = 0
    extra_rounds: int = 0
    bloom_skips: int = 0
    key_probes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _is_vector_field(field: pa.Field) -> bool:
    t = field.type
    return pa.types.is_fixed_size_list(t) and (pa.types.is_floating(t.value_type) or pa.types.is_integer(t.value_type))


def _metric(desc: Any | None) -> str:
    """The index's distance metric (Lance's name, lower case); l2 without an index."""
    details = getattr(desc, "details", None) or {}
    found = details.get("metric_type") or details.get("distance_type") if isinstance(details, dict) else None
    if found is None and desc is not None:
        text = str(details).lower()
        found = next((m for m in _METRICS if f"'{m}'" in text or f'"{m}"' in text), None)
    return str(found or "l2").lower()


def _resolve(reader: LsmReader, column: str | None) -> tuple[str, str]:
    """The searched column and its metric, from the base table's vector index (or its only vector column)."""
    table = reader.store.uri
    schema = reader.base.schema
    indexes = [d for d in reader.base.describe_indices() if len(d.field_names) == 1
               and is_vector_index(d, d.field_names[0])]
    if column is None:
        columns = sorted({d.field_names[0] for d in indexes}) or [f.name for f in schema if _is_vector_field(f)]
        if len(columns) != 1:
            raise BadInputError(f"table {table}: search needs column= (vector columns: {columns or 'none'})")
        column = columns[0]
    if column not in schema.names or not _is_vector_field(schema.field(column)):
        raise BadInputError(f"table {table}: column {column!r} for search is not a fixed-size vector column")
    desc = next((d for d in indexes if list(d.field_names) == [column]), None)
    return column, _metric(desc)


def _distances(vectors: np.ndarray, q: np.ndarray, metric: str) -> np.ndarray:
    """Lance's distances: squared L2, 1 - cosine similarity, or 1 - dot product."""
    v = vectors.astype(np.float64)
    q64 = q.astype(np.float64)
    if metric == "cosine":
        norms = np.linalg.norm(v, axis=1) * np.linalg.norm(q64)
        with np.errstate(divide="ignore", invalid="ignore"):
            return 1.0 - (v @ q64) / norms
    if metric == "dot":
        return 1.0 - v @ q64
    return ((v - q64) ** 2).sum(axis=1)


def _has_vector(column: pa.ChunkedArray) -> np.ndarray:
    """Which rows of a vector column hold a vector (not a null entry). flatten() drops the null entries, so
    those rows must go, with their addresses, before a column is turned into a matrix (_matrix)."""
    return column.is_valid().to_numpy(zero_copy_only=False)


def _matrix(column: pa.ChunkedArray, dim: int) -> np.ndarray:
    """The (rows, dim) float32 matrix of a vector column without null entries (_has_vector)."""
    return np.asarray(column.combine_chunks().flatten(), np.float32).reshape(-1, dim)


@dataclass(frozen=True)
class _FlatBlock:
    """The live newest rows of every small source of a plan, one row per entry: source position, generation,
    row address, vector (float32) and norm (float64). Built once per snapshot, view and column, so an
    unfiltered flat search of all of them is one matrix-vector product."""

    positions: np.ndarray
    gens: np.ndarray
    addrs: np.ndarray
    vecs: np.ndarray
    norms: np.ndarray


def _flat_block(reader: LsmReader, positions: tuple[int, ...], column: str, dim: int, view: View) -> _FlatBlock:
    key = ("flat block", positions, column, view)
    cache = reader.search_cache
    if key not in cache:
        parts = []
        for position in positions:
            source = source_at(reader, position)
            t = source.dataset.to_table(columns=[column], with_row_address=True)
            t = t.filter(pa.array(is_live(reader, position, t, view) & _has_vector(t.column(column))))
            vecs = _matrix(t.column(column), dim)
            parts.append((np.full(len(vecs), position), np.full(len(vecs), source.generation),
                          t.column("_rowaddr").to_numpy(), vecs))
        if parts:
            pos, gens, addrs, vecs = (np.concatenate(c) for c in zip(*parts, strict=True))
        else:
            pos, gens, addrs, vecs = np.zeros(0, int), np.zeros(0, int), np.zeros(0, np.uint64), np.zeros((0, dim))
        vecs = np.ascontiguousarray(vecs, np.float32)
        cache[key] = _FlatBlock(pos, gens, addrs.astype(np.uint64), vecs,
                                np.sqrt((vecs.astype(np.float64) ** 2).sum(axis=1)))
    return cache[key]


def _flat_top(block: _FlatBlock, q: np.ndarray, k: int, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Entries of the block and exact distances of its k nearest rows. A float32 matrix-vector product ranks
    the rows; every row within its rounding bound of the k-th is re-ranked with exact float64 distances, so
    the top k is the exact one."""
    vecs, norms = block.vecs, block.norms
    if len(norms) == 0:
        return np.zeros(0, int), np.zeros(0)
    # einsum, not `@`: a matrix-vector product through multi-threaded BLAS took 11 ms instead of 0.25 on a
    # loaded 2-core machine (its threads spin against the other work).
    dots = np.einsum("ij,j->i", vecs, q).astype(np.float64)
    qn = float(np.linalg.norm(q.astype(np.float64)))
    # |float32 dot - exact dot| <= dim * eps32 * |v| |q| (a generous bound, doubled for the other operand).
    slack = 4 * q.shape[0] * float(np.finfo(np.float32).eps)
    if metric == "cosine":
        with np.errstate(divide="ignore", invalid="ignore"):
            approx = 1.0 - dots / (norms * qn)
        bound = slack
    else:
        approx = norms ** 2 - 2 * dots + qn ** 2 if metric == "l2" else 1.0 - dots
        bound = (2 if metric == "l2" else 1) * slack * float(norms.max()) * qn
    approx = np.nan_to_num(approx, nan=np.inf)
    kth = np.partition(approx, k - 1)[k - 1] if len(approx) > k else approx.max()
    near = np.nonzero(approx <= kth + 2 * bound)[0]
    dist = _distances(vecs[near], q, metric)
    near, dist = near[np.isfinite(dist)], dist[np.isfinite(dist)]  # a zero vector under cosine: no distance
    order = np.argsort(dist, kind="stable")[:k]
    return near[order], dist[order]


def _small_source_table(reader: LsmReader, position: int, columns: tuple[str, ...], schema: pa.Schema
                 ) -> tuple[np.ndarray, pa.Table]:
    """A small source's rows (the given columns, in the result's types) with their sorted row addresses,
    read once per snapshot: a result row of it is then a slice, not a take."""
    key = ("flat rows", position, columns)
    cache = reader.search_cache
    if key not in cache:
        t = source_at(reader, position).dataset.to_table(columns=list(columns), with_row_address=True)
        addrs = t.column("_rowaddr").to_numpy().astype(np.uint64)
        order = np.argsort(addrs, kind="stable")
        cache[key] = addrs[order], t.select(list(columns)).take(pa.array(order)).cast(schema)
    return cache[key]


def _rows(reader: LsmReader, parts: list, picked: np.ndarray, columns: list[str], schema: pa.Schema) -> pa.Table:
    """The picked candidates' rows, in order: sliced from an indexed source's query result, or from the small
    source's rows read once per snapshot (_small_source_table)."""
    out, cast = [], {}
    for j, i in picked:
        table, _, _, addrs, positions = parts[j]
        if table is not None:
            if j not in cast:
                cast[j] = table.select(columns).cast(schema)
            out.append(cast[j].slice(int(i), 1))
            continue
        sorted_addrs, rows = _small_source_table(reader, int(positions[i]), tuple(columns), schema)
        out.append(rows.slice(int(np.searchsorted(sorted_addrs, addrs[i])), 1))
    return pa.concat_tables(out).combine_chunks()


def first_ask(k: int, rows: int, newer_rows: int) -> int:
    """How many candidates an indexed source is first asked for: k plus what the rows above it may shadow.
    A shadowed fraction f (at most newer_rows / rows) loses about k f of k candidates; asking k / (1 - f)
    plus three standard deviations makes a second round (a second full IVF search) rare, at most 2k (the
    earlier fixed over-fetch: on bench/search.py's 1M base under 60,000 newer rows, 14 instead of 20)."""
    f = min(0.5, newer_rows / max(rows, 1))
    return min(2 * k, math.ceil(k / (1 - f) + 3 * math.sqrt(k * f)) + 1)


def _upper_rows(reader: LsmReader, position: int, view: View) -> int:
    """Rows of the sources that may hold newer versions of the base's rows (all above it); for an indexed
    generation its own count, which caps its first ask at the earlier 2k."""
    if position != 0:
        return source_rows(reader, position)
    return sum(source_rows(reader, i) for i in upper_positions(reader, view))


def default_nprobes(partitions: int) -> int:
    """nprobes when the caller gives none: NPROBES_FRACTION of the index's IVF partitions, at least
    MIN_NPROBES, at most all of them (recall@10 >= 0.95 on bench/search.py's data, bench/README.md)."""
    return max(1, min(partitions, max(MIN_NPROBES, math.ceil(NPROBES_FRACTION * partitions))))


def _check_int(table: str, name: str, value: Any, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadInputError(f"table {table}: search {name} must be a positive integer, not {value!r}")


def vector_search(reader: LsmReader, vector: Any, *, column: str | None = None, k: int = 10,
                  filter: Filter = None, columns: Sequence[str] | None = None, nprobes: int | None = None,
                  refine_factor: int | None = None) -> pa.Table:
    """The k live newest rows nearest to `vector`, nearest first, with `_distance`. `nprobes`: the IVF
    partitions always probed (more when they hold too few rows passing the filter: never short)."""
    table = reader.store.uri
    _check_int(table, "k", k, False)
    _check_int(table, "nprobes", nprobes, True)
    _check_int(table, "refine_factor", refine_factor, True)
    cache = reader.search_cache
    if ("vector column", column) not in cache:
        cache[("vector column", column)] = _resolve(reader, column)
    column, metric = cache[("vector column", column)]
    dim = reader.base.schema.field(column).type.list_size
    try:
        q = np.asarray(vector, dtype=np.float32).reshape(-1)
    except (TypeError, ValueError) as e:
        raise BadInputError(f"table {table}: search vector is not a list of numbers: {e}") from e
    if q.shape != (dim,) or not np.isfinite(q).all():
        raise BadInputError(f"table {table}: search vector must be {dim} finite numbers for column {column!r}, "
                            f"got {q.shape[0]}")
    columns = list(columns) if columns is not None else [f.name for f in reader.base.schema]
    missing = [c for c in columns if c not in reader.base.schema.names]
    if missing:
        raise BadInputError(f"table {table}: search columns {missing} are not in the table")
    out_schema = reader.output_schema(columns)
    plan = VectorPlan(column, metric)
    reader.last_vector_plan = plan
    read = list(dict.fromkeys([*columns, column, *reader.pk]))  # keys: the newest-version check
    refine_factor = DEFAULT_REFINE_FACTOR if refine_factor is None else refine_factor
    check = NewerCheck()
    parts = []  # per source asked: its result table (None: the flat block), distances, generations, addresses,
    small = []  # positions                                                          and source positions
    for p in plan_sources(reader, column, is_vector_index, filter):
        ds = p.source.dataset
        rows = source_rows(reader, p.position)
        is_small = p.source.generation > 0 and rows <= FLAT_ROWS
        flat = p.index is None or is_small
        if flat:
            plan.flat_sources += 1
            plan.rows_served_flat += rows
        else:
            plan.indexed_sources += 1
            plan.rows_served_flat += p.unindexed_rows
        if is_small and filter is None:
            small.append(p)
            continue
        ask = k if flat else first_ask(k, rows, _upper_rows(reader, p.position, p.view))
        while True:
            nearest: dict[str, Any] = {"column": column, "q": q, "k": ask, "metric": metric, "use_index": not flat}
            if not flat:
                # The partitions always probed; Lance probes more (its maximum_nprobes left open) while those
                # hold fewer than `ask` rows passing the filter, so fewer rows than asked means exhausted.
                nearest["minimum_nprobes"] = nprobes or default_nprobes(index_partitions(reader, p.position, p.index))
                nearest["refine_factor"] = refine_factor
            got = ds.to_table(columns=read, nearest=nearest, filter=filter, prefilter=True, fast_search=p.fast_search,
                              with_row_address=True, disable_scoring_autoprojection=True)
            live = is_live(reader, p.position, got, p.view, check)
            if int(live.sum()) >= k or got.num_rows < ask or ask >= rows:
                break
            plan.extra_rounds += 1
            ask = min(rows, 2 * ask + int((~live).sum()))
        plan.candidates += got.num_rows
        plan.shadowed += int((~live).sum())
        got = got.filter(pa.array(live & _has_vector(got.column(column))))
        dist = _distances(_matrix(got.column(column), dim), q, metric)
        got, dist = got.filter(pa.array(np.isfinite(dist))), dist[np.isfinite(dist)]
        if got.num_rows:
            n = got.num_rows
            parts.append((got, dist, np.full(n, p.source.generation),
                          got.column("_rowaddr").to_numpy().astype(np.uint64), np.full(n, p.position)))
    plan.bloom_skips, plan.key_probes = check.bloom_skips, check.key_probes
    if small:
        view = small[0].view  # one plan, one view
        block = _flat_block(reader, tuple(p.position for p in small), column, dim, view)
        top, dist = _flat_top(block, q, k, metric)
        plan.candidates += len(top)
        if len(top):
            parts.append((None, dist, block.gens[top], block.addrs[top], block.positions[top]))
    if not parts:
        return out_schema.append(pa.field(DISTANCE_COLUMN, pa.float32())).empty_table()
    dist = np.concatenate([part[1] for part in parts])
    gens = np.concatenate([part[2] for part in parts])
    addrs = np.concatenate([part[3] for part in parts])
    which = np.concatenate([np.stack([np.full(len(part[1]), j), np.arange(len(part[1]))], axis=1)
                            for j, part in enumerate(parts)])
    order = np.lexsort((addrs, -gens, dist))[:k]  # nearest first; ties: newer generation, then row address
    result = _rows(reader, parts, which[order], columns, out_schema)
    return result.append_column(pa.field(DISTANCE_COLUMN, pa.float32()), pa.array(dist[order], pa.float32()))
