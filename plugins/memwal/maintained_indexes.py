"""Which base-table indexes the MemWAL maintains (MemWalIndexDetails.maintained_indexes): list, add, drop.

The spec: "index names referencing indexes defined on the base table. The primary key btree index is always
maintained implicitly and should not be listed here." So:
- add: every name must be an index of the base table (BadInputError naming the table, the index and the
  table's indexes, as Lance core's initialize_mem_wal refuses it); `__lance_mem_wal` (the MemWAL index itself)
  and the primary key's BTREE (implicit) are refused with the reason; a name already listed stays as it is.
- drop: every name must be listed (BadInputError naming the table, the index and the list): a mistyped name
  is an error, not a silent no-op. A listed name whose index was dropped from the base table can be dropped
  (that is how an operator clears it; catch-up and flush skip it meanwhile).
- maintain_all_indexes (Lance core's initialize_mem_wal without maintained_indexes: every base index) is
  switched off by any change: the list first becomes explicit (every index maintained so far, less
  `__lance_mem_wal` and the primary key's BTREE), then the change applies. An index created later is then
  maintained only once added.
- index_catchup of an added index with no entry: by catch-up's rule (`memwal.catchup.set_coverage`) as of
  the version the change commits over, an index covering every live fragment is recorded caught up to that
  version's merged_generations (pylance 14.0.2 does the same at any details commit). Otherwise no entry is
  written: Lance core stores none at generation 0 (it drops a zero or empty entry at commit, and one for an
  index the base does not have); GC and status read the absent entry by the index's coverage, as 0
  (`memwal.index_coverage`), so GC waits until catch-up covers it. An entry already there is kept: catch-up
  only ever raises it. A dropped name's entry is kept too: nothing waits for it once the name is not
  maintained.
Changes commit through `MemWalTable.commit_details` (the MemWAL index lock, no progress regression:
INTEROP.md's measured hazard); `dry_run` computes the same before/after and commits nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import lance

from memwal import naming
from memwal.errors import BadInputError
from memwal.index_coverage import covers_every_fragment
from memwal.mem_wal_index import MemWalIndexDetails
from memwal.table import MemWalTable, TableLike

__all__ = ["MaintainedIndexes", "MaintainedSet", "add_maintained", "catchup_names", "drop_maintained",
           "list_maintained", "primary_key_btrees"]


@dataclass(frozen=True)
class MaintainedSet:
    """The maintained-index configuration as stored, and what it means for the jobs."""

    maintained_indexes: list[str]  # as listed in the details
    maintain_all_indexes: bool
    maintained: list[str]  # what catch-up, GC and flush maintain (`MemWalTable.maintained_indexes`)
    not_on_base: list[str]  # of those, the ones with no index on the base table (skipped)


@dataclass
class MaintainedIndexes:
    """`memwal indexes`' answer: the set before and after (the same for `list` and a refused or empty
    change), at `table_version` (committed, or the one read for list and dry_run)."""

    table_uri: str
    action: str  # list | add | drop
    table_version: int
    before: MaintainedSet
    after: MaintainedSet
    names: list[str] = field(default_factory=list)
    dry_run: bool = False
    changed: bool = False
    base_indexes: list[str] = field(default_factory=list)  # the base table's indexes (less __lance_mem_wal)
    primary_key_indexes: list[str] = field(default_factory=list)  # its primary-key BTREE(s), implicit
    index_catchup: dict[str, dict[str, int]] = field(default_factory=dict)  # entries an add wrote
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "job": "indexes"}


def _base_indexes(ds: lance.LanceDataset) -> list[str]:
    return sorted({d.name for d in ds.describe_indices() if d.name != naming.MEM_WAL_INDEX_NAME})


def primary_key_btrees(ds: lance.LanceDataset, primary_key: Sequence[str]) -> list[str]:
    """Names of the base table's BTREE indexes on exactly the primary key (maintained implicitly)."""
    return sorted({d.name for d in ds.describe_indices()
                   if str(d.index_type).upper() == "BTREE" and list(d.field_names) == list(primary_key)})


def catchup_names(table: MemWalTable) -> list[str]:
    """The indexes catch-up keeps up to date by default: the maintained ones, then the primary key's BTREE
    when it is not listed (the spec maintains it implicitly; with maintain_all_indexes it is among all)."""
    names = table.maintained_indexes()
    return names + [n for n in primary_key_btrees(table.dataset, table.primary_key) if n not in names]


def _effective(details: MemWalIndexDetails, base: Sequence[str]) -> list[str]:
    """`MemWalTable.maintained_indexes` of these details over a base table with indexes `base`."""
    if details.maintained_indexes:
        return list(details.maintained_indexes)
    return sorted(base) if details.maintain_all_indexes else []


def _state(details: MemWalIndexDetails, base: Sequence[str]) -> MaintainedSet:
    maintained = _effective(details, base)
    return MaintainedSet(list(details.maintained_indexes), details.maintain_all_indexes, maintained,
                         [n for n in maintained if n not in base])


def list_maintained(table: TableLike) -> MaintainedIndexes:
    """The maintained indexes of the table's latest version."""
    table = MemWalTable.of(table).refresh()
    base = _base_indexes(table.dataset)
    state = _state(table.details, base)
    return MaintainedIndexes(table.uri, "list", table.version, state, state, base_indexes=base,
                             primary_key_indexes=primary_key_btrees(table.dataset, table.primary_key))


def _explicit(details: MemWalIndexDetails, base: Sequence[str], implicit: Sequence[str], notes: list[str]) -> list[str]:
    """The list the change starts from: as listed, or (maintain_all_indexes) every index maintained so far."""
    if details.maintained_indexes or not details.maintain_all_indexes:
        return list(details.maintained_indexes)
    listed = [n for n in base if n not in implicit]
    notes.append("maintain_all_indexes was set (every base index maintained): the list is now explicit, "
                 f"starting from [{', '.join(listed)}]" + (f" (the primary key's BTREE {', '.join(implicit)} is "
                                                           "maintained implicitly, not listed)" if implicit else "")
                 + "; an index created later is maintained only once added")
    return listed


def _names(names: Sequence[str], action: str) -> list[str]:
    out = list(dict.fromkeys(n.strip() for n in names))
    if not out or not all(out):
        raise BadInputError(f"indexes {action}: give at least one index NAME (got {list(names)!r})")
    return out


def _change(table: TableLike, action: str, names: Sequence[str], dry_run: bool) -> MaintainedIndexes:
    table = MemWalTable.of(table)
    names = _names(names, action)
    result: dict[str, Any] = {}

    def mutate(d: MemWalIndexDetails) -> MemWalIndexDetails:
        # Runs on the latest details under the MemWAL index lock; table.dataset is at their version.
        ds = table.dataset
        base = _base_indexes(ds)
        implicit = primary_key_btrees(ds, table.primary_key)
        notes: list[str] = []
        listed = _explicit(d, base, implicit, notes)
        catchup = {n: dict(r) for n, r in d.index_catchup.items()}
        written: dict[str, dict[str, int]] = {}
        if action == "add":
            for name in names:
                _check_addable(table.uri, name, base, implicit)
                if name in listed:
                    notes.append(f"{name} is already maintained")
                    continue
                listed.append(name)
                if name in catchup:
                    continue
                if covers_every_fragment(ds, name) and d.merged_generations:
                    written[name] = catchup[name] = dict(d.merged_generations)
                    notes.append(f"{name} covers every live fragment: caught up to the merged generations")
                else:
                    notes.append(f"{name} does not cover every live fragment: read as caught up to generation 0 "
                                 "(GC waits for it) until catch-up covers it")
        else:
            for name in names:
                if name not in listed:
                    raise BadInputError(f"index {name!r} is not maintained by the MemWAL of table {table.uri} "
                                        f"(maintained: {', '.join(listed) or 'none'}); nothing was changed")
                listed.remove(name)
        after = replace(d, maintained_indexes=tuple(listed), maintain_all_indexes=False, index_catchup=catchup)
        result.update(before=_state(d, base), after=_state(after, base), base=base, implicit=implicit,
                      notes=notes, written=written, version=ds.version,
                      changed=(after.maintained_indexes, after.maintain_all_indexes)
                      != (d.maintained_indexes, d.maintain_all_indexes))
        return after

    # The check and the commit see the same latest details (a dry run waits for no lock).
    with nullcontext() if dry_run else table.index_lock():
        mutate(table.refresh().details)
        if not dry_run and (result["changed"] or result["written"]):
            # commit_details' loop calls mutate again on the latest details (a commit may have landed since).
            result["version"] = table.commit_details_locked(mutate).table_version
    return MaintainedIndexes(table.uri, action, result["version"], result["before"], result["after"], names,
                             dry_run, result["changed"], result["base"], result["implicit"], result["written"],
                             result["notes"])


def _check_addable(uri: str, name: str, base: Sequence[str], implicit: Sequence[str]) -> None:
    if name == naming.MEM_WAL_INDEX_NAME:
        raise BadInputError(f"index {name!r} of table {uri} is the MemWAL index itself, not a base-table index "
                            "to maintain; nothing was changed")
    if name in implicit:
        raise BadInputError(f"index {name!r} of table {uri} is the primary key's BTREE, which the MemWAL maintains "
                            "implicitly and the spec says is not listed in maintained_indexes; nothing was changed")
    if name not in base:
        raise BadInputError(f"index {name!r}: no such index in table {uri} (its indexes: "
                            f"{', '.join(base) or 'none'}); create it on the base table first; nothing was changed")


def add_maintained(table: TableLike, names: Sequence[str], *, dry_run: bool = False) -> MaintainedIndexes:
    """Add base-table indexes to maintained_indexes (module docstring: the rules, maintain_all_indexes,
    index_catchup); BadInputError naming the table and the index when one cannot be added."""
    return _change(table, "add", names, dry_run)


def drop_maintained(table: TableLike, names: Sequence[str], *, dry_run: bool = False) -> MaintainedIndexes:
    """Remove names from maintained_indexes; BadInputError naming the table and the index when one is not
    listed (nothing changed)."""
    return _change(table, "drop", names, dry_run)

