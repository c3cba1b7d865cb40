"""Vector search over the LSM view (base table, flushed generations, MemTables): the k nearest live newest rows.

Every source of the read plan (memwal.search_plan) is asked through its own vector index, with the filter as a
prefilter; a source without one is searched flat by Lance, and the generations and MemTables small enough
(FLAT_ROWS) are searched flat as one block (memwal.flat_block), filtered or not, so a generation's index type
never makes the result less exact than the base table's own search. What an unfiltered search asks is worked
out once per snapshot (_layout). A candidate counts only if it is its key's newest live version; a source
whose candidates were shadowed is asked for more until k live rows are found or it is exhausted (never
short). Candidates are re-ranked by exact distances computed from their vectors. A row whose distance is
undefined (a null vector; a zero vector under cosine) is never a result, as in Lance.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from memwal.errors import BadInputError
from memwal.flat_block import distances, flat_block, flat_top, has_vector, matrix, passing, small_rows
from memwal.newest_version import NewerCheck
from memwal.search_plan import (
    PlannedSource,
    View,
    index_partitions,
    is_live,
    is_vector_index,
    plan_sources,
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
# Search the small sources' block in a thread while Lance searches the base (bench/README.md: what it gains):
# True, False, or None: unless the machine is oversubscribed (`_spare_core`). On the 2-core machine at load
# 1.6-3.4 (the benchmark's own) it took 0.5-1 ms off a 10 ms search; at load 6-9 (other test suites beside it)
# it cost 0.7-1.3 ms: the thread waits for a core other work holds.
CONCURRENT: bool | None = None
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _spare_core() -> bool:
    """Whether a second core can take the block while Lance searches the base: more than one core, and the
    last minute's load average (this process's searches included) below twice their number: a machine more
    loaded than that searches one after the other."""
    cpus = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        return False
    return cpus > 1 and load < 2 * cpus


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


def _rows(reader: LsmReader, parts: list, picked: np.ndarray, columns: list[str], schema: pa.Schema) -> pa.Table:
    """The picked candidates' rows, in order: sliced from an indexed source's query result, or from the small
    source's rows read once per snapshot (flat_block.small_rows). Row by row: k one-row slices cost a fifth of
    one take per part and a reordering take (21 against 101 us for k = 10, bench/README.md)."""
    out, cast = [], {}
    for j, i in picked:
        table, _, _, addrs, positions = parts[j]
        if table is not None:
            if j not in cast:
                cast[j] = table.select(columns).cast(schema)
            out.append(cast[j].slice(int(i), 1))
            continue
        sorted_addrs, rows = small_rows(reader, int(positions[i]), tuple(columns), schema)
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


def _pool() -> ThreadPoolExecutor:
    """The threads the small sources' block is searched in while Lance searches the base (both release the GIL)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="memwal-flat-search")
        return _POOL


def _check_int(table: str, name: str, value: Any, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadInputError(f"table {table}: search {name} must be a positive integer, not {value!r}")


@dataclass(frozen=True)
class _Layout:
    """What a search with no filter asks, fixed per snapshot, column and k (cached): the sources asked through
    Lance (with their row counts, whether flat, and the first ask), the small sources searched as one block,
    and the plan's counts."""

    asked: list[tuple[PlannedSource, int, bool, int]]
    small: tuple[int, ...]
    view: View
    counts: dict[str, int] = field(default_factory=dict)


def _layout(reader: LsmReader, column: str, k: int, filter: Filter) -> _Layout:
    key = ("vector layout", column, k, FLAT_ROWS)
    cache = reader.search_cache
    if filter is None and key in cache:
        return cache[key]
    asked, small, view = [], [], ()
    counts = {"indexed_sources": 0, "flat_sources": 0, "rows_served_flat": 0}
    for p in plan_sources(reader, column, is_vector_index, filter):
        view = p.view  # one plan, one view
        rows = source_rows(reader, p.position)
        is_small = p.source.generation > 0 and rows <= FLAT_ROWS
        flat = p.index is None or is_small
        counts["flat_sources" if flat else "indexed_sources"] += 1
        counts["rows_served_flat"] += rows if flat else p.unindexed_rows
        if is_small:
            small.append(p.position)
        else:
            asked.append((p, rows, flat, k if flat else first_ask(k, rows, _upper_rows(reader, p.position, p.view))))
    layout = _Layout(asked, tuple(small), view, counts)
    if filter is None:
        cache[key] = layout
    return layout


def _ask(reader: LsmReader, p: PlannedSource, rows: int, flat: bool, ask: int, q: np.ndarray, k: int,
         read: list[str], filter: Filter, nprobes: int | None, refine_factor: int, metric: str, plan: VectorPlan,
         check: NewerCheck) -> tuple[pa.Table, np.ndarray]:
    """A source asked through Lance until k of its candidates are live or it is exhausted (never short): its
    live candidates with a vector, and their exact distances."""
    column = plan.column
    while True:
        nearest: dict[str, Any] = {"column": column, "q": q, "k": ask, "metric": metric, "use_index": not flat}
        if not flat:
            # The partitions always probed; Lance probes more (its maximum_nprobes left open) while those
            # hold fewer than `ask` rows passing the filter, so fewer rows than asked means exhausted.
            nearest["minimum_nprobes"] = nprobes or default_nprobes(index_partitions(reader, p.position, p.index))
            nearest["refine_factor"] = refine_factor
        got = p.source.dataset.to_table(columns=read, nearest=nearest, filter=filter, prefilter=True,
                                        fast_search=p.fast_search, with_row_address=True,
                                        disable_scoring_autoprojection=True)
        live = is_live(reader, p.position, got, p.view, check)
        if int(live.sum()) >= k or got.num_rows < ask or ask >= rows:
            break
        plan.extra_rounds += 1
        ask = min(rows, 2 * ask + int((~live).sum()))
    plan.candidates += got.num_rows
    plan.shadowed += int((~live).sum())
    keep = live & has_vector(got.column(column))
    if not keep.all():
        got = got.filter(pa.array(keep))
    dist = distances(matrix(got.column(column), len(q)), q, metric)
    finite = np.isfinite(dist)
    return (got, dist) if finite.all() else (got.filter(pa.array(finite)), dist[finite])


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
    layout = _layout(reader, column, k, filter)
    plan = VectorPlan(column, metric, **layout.counts)
    reader.last_vector_plan = plan
    read = list(dict.fromkeys([*columns, column, *reader.pk]))  # keys: the newest-version check
    refine_factor = DEFAULT_REFINE_FACTOR if refine_factor is None else refine_factor
    check = NewerCheck()
    parts = []  # per source asked: its result table (None: the flat block), distances, generations, addresses,
    #             source positions
    pending = None
    if layout.small:
        block = flat_block(reader, layout.small, column, dim, layout.view, metric)
        passing_rows = None if filter is None else passing(reader, block, layout.small, filter)
        if layout.asked and (_spare_core() if CONCURRENT is None else CONCURRENT):
            pending = _pool().submit(flat_top, block, q, k, metric, passing_rows)
    for p, rows, flat, ask in layout.asked:
        got, dist = _ask(reader, p, rows, flat, ask, q, k, read, filter, nprobes, refine_factor, metric, plan, check)
        if got.num_rows:
            n = got.num_rows
            parts.append((got, dist, np.full(n, p.source.generation),
                          got.column("_rowaddr").to_numpy().astype(np.uint64), np.full(n, p.position)))
    plan.bloom_skips, plan.key_probes = check.bloom_skips, check.key_probes
    if layout.small:
        top, dist = pending.result() if pending is not None else flat_top(block, q, k, metric, passing_rows)
        plan.candidates += len(top)
        if len(top):
            parts.append((None, dist, block.gens[top], block.addrs[top], block.positions[top]))
    if not parts:
        return out_schema.append(pa.field(DISTANCE_COLUMN, pa.float32())).empty_table()
    if len(parts) == 1:
        dist, gens, addrs = parts[0][1], parts[0][2], parts[0][3]
        which = np.stack([np.zeros(len(dist), int), np.arange(len(dist))], axis=1)
    else:
        dist = np.concatenate([part[1] for part in parts])
        gens = np.concatenate([part[2] for part in parts])
        addrs = np.concatenate([part[3] for part in parts])
        which = np.concatenate([np.stack([np.full(len(part[1]), j), np.arange(len(part[1]))], axis=1)
                                for j, part in enumerate(parts)])
    order = np.lexsort((addrs, -gens, dist))[:k]  # nearest first; ties: newer generation, then row address
    result = _rows(reader, parts, which[order], columns, out_schema)
    return result.append_column(pa.field(DISTANCE_COLUMN, pa.float32()), pa.array(dist[order], pa.float32()))
