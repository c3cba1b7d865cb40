"""Rows outside their region: a put whose rows' region values belong to another region is refused.

memwal-spec.txt "MemWAL Region": a primary key lives in one region, the one its region spec names; if two
regions hold one key, its newest version is decided by which region's merge commits last, not by which
write came last. A region's values, the ones its rows must evaluate to (`memwal.transforms.evaluate`):
- a region named after its values (a UUID v5: our TableWriter's and LanceDB's, `memwal.region_ids`): the
  value tuple whose id it is;
- any other region of a spec (a UUID v4, as Lance core and a hand-made writer name them): the values of the
  rows it holds (its MemTable, else a flushed generation), else of the first row put to it.
Not checked: a manual region (spec id 0; docs/library.md says what two regions writing one key mean), a
spec with a SQL expression (this library cannot evaluate those), deletes (a tombstone carries the key only).
"""

from __future__ import annotations

import logging
import math
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from memwal import naming
from memwal.errors import BadInputError, MemWalError, RegionSpecError
from memwal.field_ids import column_names, resolve_column, source_names_from_schema
from memwal.generation import open_generation
from memwal.region_ids import named_by_values, region_ids_of, writer_region_id
from memwal.region_spec import RegionSpec
from memwal.transforms import evaluate

if TYPE_CHECKING:
    from memwal.writer import RegionWriter

__all__ = ["RegionRows", "check_rows_in_region", "differing_rows"]

log = logging.getLogger(__name__)


def differing_rows(values: pa.Table, expected: tuple) -> pa.ChunkedArray | pa.Array | None:
    """A boolean mask of the rows whose region values (evaluate's output) differ from `expected`; None when
    none do. NULL equals NULL and NaN equals NaN here, as one region value."""
    mask = None
    for column, want in zip(values.columns, expected, strict=True):
        if want is None:
            bad = pc.is_valid(column)
        elif isinstance(want, float) and math.isnan(want):
            bad = pc.invert(pc.fill_null(pc.is_nan(column), False))
        else:
            bad = pc.invert(pc.fill_null(pc.equal(column, pa.scalar(want, column.type)), False))
        mask = bad if mask is None else pc.or_(mask, bad)
    return mask if mask is not None and pc.any(mask).as_py() else None


@dataclass
class RegionRows:
    """What one region writer checks its puts against: the region's spec (None: nothing to check) and, once
    known, the region's value tuple."""

    table_uri: str
    region_id: str
    spec: RegionSpec | None
    values: tuple | None = None
    _names: tuple[pa.Schema, dict[int, str]] | None = field(default=None, repr=False)

    def names(self, schema: pa.Schema) -> dict[int, str]:
        """Source field id -> column name for the writer's schema (recomputed when the schema changed)."""
        if self._names is None or self._names[0] is not schema:
            self._names = (schema, source_names_from_schema(schema))
        return self._names[1]

    def check(self, table: pa.Table, schema: pa.Schema, held: pa.Table | None = None) -> None:
        """Refuse (BadInputError, nothing written) a put with a row of another region. held: one row the
        region already holds, for a region not named after its values whose values are not known yet."""
        if self.spec is None or table.num_rows == 0 or (self.values is not None and self._one_value()):
            return
        names = self.names(schema)
        values = evaluate(self.spec, table, names)
        expected = self.values
        if expected is None:
            first = held if held is not None and held.num_rows else None
            source = evaluate(self.spec, first, names) if first is not None else values
            expected = tuple(c[0].as_py() for c in source.columns)
            if named_by_values(self.region_id) and self.region_id not in region_ids_of(self.spec, expected):
                self._refuse(table, values, names, 0, None)
        bad = differing_rows(values, expected)
        if bad is not None:
            self._refuse(table, values, names, pc.index(bad, True).as_py(), expected)
        self.values = expected

    def _one_value(self) -> bool:
        """Every row has the same region values (an unsharded spec): once the region's are known, nothing
        is left to check."""
        assert self.spec is not None
        return all(f.transform == "unsharded" for f in self.spec.fields)

    def _refuse(self, table: pa.Table, values: pa.Table, names: dict[int, str], row: int,
                expected: tuple | None) -> None:
        assert self.spec is not None
        got = tuple(c[row].as_py() for c in values.columns)
        fields = [i for i, f in enumerate(self.spec.fields) if expected is None or got[i] != expected[i]]
        fld = self.spec.fields[fields[0] if fields else 0]
        columns = column_names(fld, names) if fld.transform != "unsharded" else []
        shown = ", ".join(f"{c} = {_value(table, c, row)!r}" for c in columns) or "its values"
        mine = (f"this region's is {expected[self.spec.fields.index(fld)]!r}" if expected is not None
                else "this region is named after other values")
        raise BadInputError(
            f"table {self.table_uri}: region {self.region_id} (region spec {self.spec.spec_id}) refuses a put: "
            f"row {row} has {shown}, so its region field {fld.field_id!r} is "
            f"{got[self.spec.fields.index(fld)]!r}, and {mine}; the row belongs to region "
            f"{writer_region_id(self.spec, got)}. Write each key to the region its region spec names "
            "(memwal.table_writer.TableWriter routes rows): a key held by two regions gets its newest version "
            "from merge order, not write order. Nothing of this put was written.")


def _value(table: pa.Table, column: str, row: int) -> Any:
    array = resolve_column(table, column)
    return None if array is None else array[row].as_py()


def _spec_of(writer: RegionWriter) -> RegionSpec | None:
    """The region spec the writer's region was created with; None for a manual region, or one whose spec
    this library cannot evaluate (a SQL expression: logged, the put is not checked)."""
    spec_id = writer.manifest.region_spec_id
    if not spec_id:
        return None
    try:
        index = writer.mem_wal_index  # read when the writer opened or last saw the base move
        if index is None:
            return None
        spec = index.details.region_spec(spec_id)
    except RegionSpecError as exc:
        log.warning("region %s: its rows are not checked against region spec %d: %s", writer.region_id,
                    spec_id, exc)
        return None
    if any(f.expression is not None for f in spec.fields):
        log.info("region %s: region spec %d has a SQL expression: rows are not checked against it",
                 writer.region_id, spec_id)
        return None
    return spec


def _held_row(writer: RegionWriter) -> pa.Table | None:
    """One row (not a tombstone) the region holds: from the MemTable, else its flushed generations."""
    live = writer.memtable_table()
    if live.num_rows:
        rows = live.filter(pc.invert(live.column(naming.TOMBSTONE_COLUMN)))
        if rows.num_rows:
            return rows.slice(0, 1)
    for fg in sorted(writer.manifest.flushed_generations, key=lambda g: g.generation):
        try:
            ds = open_generation(writer.store, writer.region_id, fg.generation, fg.path)
            rows = ds.to_table(filter=f"{naming.TOMBSTONE_COLUMN} = false", limit=1)
        except (MemWalError, OSError, pa.ArrowException):  # merged and collected meanwhile
            continue
        if rows.num_rows:
            return rows
    return None


_CHECKS: weakref.WeakKeyDictionary[Any, RegionRows] = weakref.WeakKeyDictionary()


def check_rows_in_region(writer: RegionWriter, table: pa.Table) -> None:
    """RegionWriter.put's check, before anything is written: BadInputError naming the table, region, spec,
    column and an offending value when a row belongs to another region (see the module docstring). The
    region's spec is read once per writer, on its first put."""
    rows = _CHECKS.get(writer)
    if rows is None:
        rows = _CHECKS[writer] = RegionRows(writer.table_uri, writer.region_id, _spec_of(writer))
    held = None
    if rows.spec is not None and rows.values is None and not named_by_values(writer.region_id):
        held = _held_row(writer)
    rows.check(table, writer.schema, held)
