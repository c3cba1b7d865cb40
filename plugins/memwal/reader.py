"""The LSM reader: one view over the base table (generation 0), flushed generations and live MemTables.

For each primary key the newest version wins: highest generation, then highest row address
(memwal-spec.txt, LSM Tree Merging Read); a winning tombstone hides the key. A filter is applied to
the winning version only, so an update that stops matching hides the older matching row.
Generations at or below merged_generations[region] are skipped: the base table already has them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal import naming
from memwal.dedup import GEN_COLUMN, ROWADDR_COLUMN, SOURCE_COLUMN, newest_per_key
from memwal.errors import BadInputError, MemWalError, MemWalNotInitializedError, MissingGenerationError
from memwal.field_ids import source_names_from_schema
from memwal.generation import memory_dataset, open_generation
from memwal.lsm_source import Source
from memwal.primary_key import refuse_null_base_keys, refuse_null_keys
from memwal.pruning import prune
from memwal.region_manifest import RegionManifest
from memwal.schema import conform_to, tombstone_schema
from memwal.source_cache import cached
from memwal.sql_predicates import parse_simple_predicates
from memwal.table import MemWalTable, TableLike

__all__ = ["LsmReader", "Source"]

log = logging.getLogger(__name__)
_MAX_OPEN_ATTEMPTS = 16

Filter = str | pc.Expression | None
_GEN, _ADDR = GEN_COLUMN, ROWADDR_COLUMN


class LsmReader:
    """Reads a MemWAL table as of its handle's version (or a base-table version), optionally with live
    MemTables. A table given as a URI is opened at its latest version. A reader is a snapshot: it reads that
    version (and the generations listed when it opened) for its whole life, whatever later moves the handle.

    memtables: (region_id, generation, rows with _tombstone), e.g. from RegionWriter.memtable_table().
    """

    def __init__(
        self,
        table: TableLike,
        *,
        version: int | None = None,
        memtables: Sequence[tuple[str, int, pa.Table]] = (),
        regions: Sequence[str] | None = None,
    ):
        self.table = MemWalTable.of(table)
        self.store = self.table.store
        wanted = set(regions) if regions is not None else None
        for attempt in range(_MAX_OPEN_ATTEMPTS):
            if attempt:
                self.table.refresh()
            collected = self._open(version, wanted)
            if collected is None:
                break
            region_id, generation, merged = collected
            if version is not None:
                raise MissingGenerationError(
                    region_id, generation, f"{self.store.uri}/{naming.region_dir(region_id)}",
                    f"merged after base version {version} (which holds merged generation {merged}) and "
                    "collected; read a newer version",
                )
            log.info("region %s: generation %d was merged and collected while the reader opened version %d; "
                     "opening the newest version", region_id, generation, self.base.version)
        else:
            raise MemWalError(f"{self.store.uri}: merges and GC kept moving ahead of the reader; try again")
        for region_id, generation, rows in memtables:
            if rows.num_rows and (wanted is None or region_id in wanted):
                # a writer that has not seen a column added since reads it as null, as a generation does
                rows = conform_to(rows, tombstone_schema(self.base.schema))
                self.sources.append(Source(region_id, generation, memory_dataset(rows), True))

    def _open(self, version: int | None, wanted: set[str] | None) -> tuple[str, int, int] | None:
        """Open the base version and the generations above its merged_generations.

        Returns (region, generation, merged) when a generation above the base version's merged generation
        is no longer in the region manifest: merged after that version and collected by GC while we opened
        it, so neither the base nor the generations hold its rows (check-then-act on the manifest).
        """
        # A dataset of the reader's own: the handle's moves in place (refresh, a job's commit on it), the
        # reader's snapshot must not (its cached masks, counts and keys are of this version).
        at = self.table.checkout(self.table.version if version is None else version)
        self.base = at.dataset
        self.pk = at.primary_key
        refuse_null_base_keys(self.base, self.pk, f"table {self.store.uri} (base version {self.base.version})")
        try:
            # merged_generations as of the very base version we scan: a merge committed meanwhile must
            # not make us skip generations the older base does not hold.
            details = at.details
        except MemWalNotInitializedError:
            details = None
        merged = dict(details.merged_generations) if details else {}
        # The read plan (memwal.search_plan) serves (index_catchup, merged] through the generations' own indexes.
        self.merged_generations: dict[str, int] = merged
        self.index_catchup: dict[str, dict[str, int]] = (
            {n: dict(r) for n, r in details.index_catchup.items()} if details else {})
        self.region_specs = details.region_specs if details else ()
        self.manifests: dict[str, RegionManifest] = {}
        # Per snapshot: live addresses, term counts, index descriptions, opened gap generations; searches do not
        # reopen or recount them (memwal.search_plan).
        self.search_cache: dict = {}
        self.last_fts_plan = None
        self.last_vector_plan = None
        self._region_values: dict[str, tuple] | None = None
        self.last_scan_regions: set[str] | None = None
        self.sources: list[Source] = [Source(None, 0, self.base, False)]
        for region_id in at.regions():
            if wanted is not None and region_id not in wanted:
                continue
            manifest = at.manifest(region_id)
            self.manifests[region_id] = manifest
            floor = merged.get(region_id, 0)
            listed = {fg.generation for fg in manifest.flushed_generations}
            gone = next((g for g in range(floor + 1, manifest.current_generation) if g not in listed), None)
            if gone is not None:
                return region_id, gone, floor
            for fg in sorted(manifest.flushed_generations, key=lambda g: g.generation):
                if fg.generation <= floor:
                    continue
                ds = open_generation(self.store, region_id, fg.generation, fg.path, self.base.schema)
                self.sources.append(Source(region_id, fg.generation, ds, True, fg.path))
        return None

    def regions_for(self, filter: Filter) -> set[str] | None:
        """Regions that may hold rows matching a filter of `col = v` / `col IN (...)` terms (None: all)."""
        if not isinstance(filter, str) or len(self.region_specs) != 1 or not self.manifests:
            return None
        predicates = parse_simple_predicates(filter)
        if not predicates:
            return None
        spec = self.region_specs[0]
        if self._region_values is None:
            from memwal.snapshot import region_field_values

            self._region_values = {}
            for region_id, m in self.manifests.items():
                values = region_field_values(self.store, m, self.region_specs, self.base.schema)
                if m.region_spec_id == spec.spec_id and values:
                    self._region_values[region_id] = tuple(values[f.column_name] for f in spec.fields)
        unknown = set(self.manifests) - set(self._region_values)
        names = source_names_from_schema(self.base.schema)
        return prune(spec, predicates, names, self._region_values, schema=self.base.schema) | unknown

    def _active(self, filter: Filter) -> list[tuple[int, Source]]:
        regions = self.regions_for(filter)
        self.last_scan_regions = regions
        return [(i, s) for i, s in enumerate(self.sources)
                if s.region_id is None or regions is None or s.region_id in regions]

    def _keys(self, source_index: int, source: Source) -> pa.Table:
        cols = list(self.pk) + ([naming.TOMBSTONE_COLUMN] if source.has_tombstone else [])

        def read() -> pa.Table:
            t = source.dataset.to_table(columns=cols, with_row_address=True)
            refuse_null_keys(t, self.pk, self._describe(source))
            return t

        # a flushed generation's keys are read once per process (memwal.source_cache), not once per snapshot
        t = cached(source.dataset, ("keys", tuple(cols)), read) if source.path is not None else read()
        n = t.num_rows
        tomb = t.column(naming.TOMBSTONE_COLUMN) if source.has_tombstone else pa.array(np.zeros(n, bool))
        return pa.table(
            {
                **{c: t.column(c) for c in self.pk},
                naming.TOMBSTONE_COLUMN: tomb,
                _GEN: pa.array(np.full(n, source.generation, np.int64)),
                _ADDR: t.column("_rowaddr"),
                SOURCE_COLUMN: pa.array(np.full(n, source_index, np.int32)),
            }
        )

    def _describe(self, source: Source) -> str:
        """The source for an error message: table, and region and generation (a MemTable's too)."""
        if source.region_id is None:
            return f"table {self.store.uri} (base version {self.base.version})"
        kind = "generation" if source.path is not None else "MemTable of generation"
        return f"table {self.store.uri} region {source.region_id} {kind} {source.generation}"

    def winners(self, active: list[tuple[int, Source]], *, tombstones: bool = False) -> pa.Table:
        """One row per live primary key: the source and row address of its newest version (with
        tombstones=True also the keys whose newest version is a tombstone, _tombstone telling which)."""
        keys = pa.concat_tables([self._keys(i, s) for i, s in active], promote_options="permissive")
        winners = newest_per_key(keys, self.pk)
        return winners if tombstones else winners.filter(pc.invert(winners.column(naming.TOMBSTONE_COLUMN)))

    def scan(self, columns: Sequence[str] | None = None, filter: Filter = None) -> pa.Table:
        """All live rows (newest version per key) matching filter, with the given columns."""
        columns = list(columns) if columns is not None else [f.name for f in self.base.schema]
        active = self._active(filter)
        winners = self.winners(active)
        parts = []
        for i, source in active:
            mine = winners.filter(pc.equal(winners.column(SOURCE_COLUMN), i)).column(_ADDR)
            if len(mine) == 0:
                continue
            rows = source.dataset.to_table(columns=columns, filter=filter, with_row_address=True)
            rows = rows.filter(pc.is_in(rows.column("_rowaddr"), value_set=mine.combine_chunks()))
            parts.append(rows.drop_columns(["_rowaddr"]).cast(self.output_schema(columns)))
        if not parts:
            return self.output_schema(columns).empty_table()
        return pa.concat_tables(parts)

    def count_rows(self, filter: Filter = None) -> int:
        return self.scan(columns=self.pk, filter=filter).num_rows

    def get(self, key: Any | Sequence[Any], columns: Sequence[str] | None = None) -> dict | None:
        """Point lookup by primary key (a value, or a tuple for a composite key): newest source first."""
        values = tuple(key) if len(self.pk) > 1 else (key,)
        if any(v is None for v in values):
            raise BadInputError(f"table {self.store.uri}: get of a null primary key {key!r}; a key is never null")
        expr = None
        for c, v in zip(self.pk, values, strict=True):
            term = pc.field(c) == v
            expr = term if expr is None else expr & term
        columns = list(columns) if columns is not None else [f.name for f in self.base.schema]
        for source in sorted(self.sources, key=lambda s: s.generation, reverse=True):
            cols = columns + ([naming.TOMBSTONE_COLUMN] if source.has_tombstone else [])
            rows = source.dataset.to_table(columns=list(dict.fromkeys(cols)), filter=expr)
            if rows.num_rows == 0:
                continue
            last = rows.slice(rows.num_rows - 1).to_pylist()[0]  # the later row within a generation
            if source.has_tombstone and last.pop(naming.TOMBSTONE_COLUMN):
                return None
            return {c: last[c] for c in columns}
        return None

    def full_text_search(self, query: str, *, column: str | None = None, k: int = 10, filter: Filter = None,
                         columns: Sequence[str] | None = None) -> pa.Table:
        """The k live newest rows best matching `query`, best first, with `_score`: one BM25 over the whole LSM
        view (memwal.full_text_search). `column` defaults to the base table's only INVERTED-indexed column."""
        from memwal.full_text_search import full_text_search

        return full_text_search(self, query, column=column, k=k, filter=filter, columns=columns)

    def search(self, vector: Any, *, column: str | None = None, k: int = 10, filter: Filter = None,
               columns: Sequence[str] | None = None, nprobes: int | None = None,
               refine_factor: int | None = None) -> pa.Table:
        """The k live newest rows nearest to `vector`, nearest first, with `_distance` (memwal.vector_search).
        `column` defaults to the base table's only vector-indexed (or vector) column."""
        from memwal.vector_search import vector_search

        return vector_search(self, vector, column=column, k=k, filter=filter, columns=columns, nprobes=nprobes,
                             refine_factor=refine_factor)

    def output_schema(self, columns: Sequence[str]) -> pa.Schema:
        """The base table's schema of the given columns (the shape of every result)."""
        return pa.schema([self.base.schema.field(c) for c in columns])
