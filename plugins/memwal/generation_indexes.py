"""The maintained indexes a flush builds on a generation: the base table's, same name and column.

Lance core's and LanceDB's LSM planners search a generation through the index that has the base index's
name; a generation without it is planned as empty (its rows vanish from vector and FTS results). Types:
- vector: IVF_FLAT with one partition and the base index's metric: both planners search it, it needs no
  training (Lance core's IVF_HNSW_SQ took far longer to build at flush sizes, bench/README.md), and a
  flat partition is exact, so a generation's index never makes a search less exact than the base's;
- full-text: INVERTED with the base index's tokenizer parameters (read from its details);
- scalar (BTREE, BITMAP, ...): the base index's type.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import lance
import pyarrow as pa

from memwal import naming

log = logging.getLogger(__name__)

_VECTOR_PREFIXES = ("IVF_", "HNSW")
# describe_indices() names a type differently from create_scalar_index in one case (upper-cased).
_CREATE_TYPES = {"LABELLIST": "LABEL_LIST"}
# The INVERTED index parameters create_scalar_index takes, as describe_indices() reports them.
_FTS_PARAMS = (
    "base_tokenizer", "language", "with_position", "max_token_length", "lower_case", "stem",
    "remove_stop_words", "custom_stop_words", "ascii_folding", "min_ngram_length", "max_ngram_length",
    "prefix_only",
)


@dataclass(frozen=True)
class MaintainedIndex:
    """One base-table index a flush rebuilds on the generation: name, column, and how to build it."""

    name: str
    column: str
    kind: str  # "vector", "fts" or "scalar"
    index_type: str  # the type created on the generation
    params: dict[str, Any] = field(default_factory=dict)


def _spec(name: str, column: str, base_type: str, details: dict) -> MaintainedIndex:
    upper = base_type.upper()
    if upper.startswith(_VECTOR_PREFIXES):
        metric = str(details.get("metric_type") or "L2").lower()
        return MaintainedIndex(name, column, "vector", "IVF_FLAT", {"num_partitions": 1, "metric": metric})
    if upper == "INVERTED":
        params = {k: details[k] for k in _FTS_PARAMS if details.get(k) is not None}
        return MaintainedIndex(name, column, "fts", "INVERTED", params)
    return MaintainedIndex(name, column, "scalar", _CREATE_TYPES.get(upper, upper), {})


def maintained_index_specs(base: lance.LanceDataset, names: list[str]) -> list[MaintainedIndex]:
    """The maintained indexes that exist on the base table (names not on it are skipped, as Lance core does)."""
    wanted = set(names) - {naming.MEM_WAL_INDEX_NAME}
    specs = []
    for d in base.describe_indices():
        if d.name in wanted and len(d.field_names) == 1:
            specs.append(_spec(d.name, d.field_names[0], d.index_type, dict(d.details or {})))
    return sorted(specs, key=lambda s: s.name)


def build_generation_indexes(
    ds: lance.LanceDataset, table: pa.Table, specs: list[MaintainedIndex], where: str = "generation"
) -> lance.LanceDataset:
    """Create each maintained index on the freshly written generation dataset (`table` is its rows).

    A generation of deletes only has no vectors to train on: it gets no vector index, and the planners
    plan it as empty, which is right (it has no row to return; its tombstones act through `_pk_index`).
    An index Lance cannot build here is skipped with a warning, as Lance core's flush skips what no plugin
    maintains: our reader searches such a generation flat; a flush never fails for a secondary index.
    """
    existing = {d.name for d in ds.describe_indices()}
    for s in specs:
        if s.name in existing:  # the key's BTREE when the base maintains a same-named one on the key
            continue
        if s.kind == "vector" and table.column(s.column).null_count == table.num_rows:
            continue
        try:
            if s.kind == "vector":
                ds.create_index(s.column, s.index_type, name=s.name, **s.params)
            else:
                ds.create_scalar_index(s.column, s.index_type, name=s.name, **s.params)
        except Exception as exc:  # any index Lance refuses is skipped, never fatal
            log.warning("%s: maintained index %r (%s on column %r) not built on this generation: %s; our reader "
                        "searches it without the index, Lance core's and LanceDB's planners skip it until merged",
                        where, s.name, s.index_type, s.column, str(exc).splitlines()[0])
    return ds
