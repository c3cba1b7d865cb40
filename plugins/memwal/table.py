"""MemWalTable: one MemWAL table opened once and carried through every job (like pyiceberg's `Table`).

The handle holds the table's object store, its base dataset (with its schema and primary key) and its
MemWAL index, each opened or loaded once. `refresh()` moves the dataset to the latest version in place
(Lance's `checkout_latest`) and reloads the index only when the version moved. The jobs, status, lag, the
LSM reader and GC take a handle; it pickles down to its URI and storage options (what a Spark executor
needs to open the table again), never to open handles.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import cached_property
from typing import Any

import lance
import pyarrow as pa

from memwal import mem_wal_index, naming
from memwal.dataset_identity import cache_key
from memwal.errors import CommitConflictError, TableNotFoundError, is_table_not_found
from memwal.faults import fault_point
from memwal.lock import TableLock, index_lock
from memwal.mem_wal_index import MemWalIndex, MemWalIndexDetails, index_of
from memwal.primary_key import primary_key_columns
from memwal.region_manifest import RegionManifest, list_regions, load_latest_manifest
from memwal.storage import ObjectStore, lance_storage_options

__all__ = ["MemWalTable", "TableLike"]

log = logging.getLogger(__name__)


class MemWalTable:
    """A MemWAL table: store, base dataset, schema, primary key and MemWAL index, each opened once."""

    def __init__(self, uri: str, storage_options: dict[str, str] | None = None, *, version: int | None = None):
        """Nothing is read here: the dataset opens on first use (`open` opens it at once)."""
        self.store = ObjectStore(uri, storage_options)
        self._version = version
        self._dataset: lance.LanceDataset | None = None
        self._index: MemWalIndex | None = None
        self._index_of: tuple[str, int, int] | None = None  # the cache_key of the version `_index` was read at
        self._lease: TableLock | None = None

    @classmethod
    def open(cls, uri: str, storage_options: dict[str, str] | None = None, version: int | None = None) -> MemWalTable:
        """Open the table (the latest version, or `version`); a missing table fails here, not later."""
        table = cls(uri, storage_options, version=version)
        table.dataset  # noqa: B018 - opens it
        return table

    @classmethod
    def of(cls, table: TableLike) -> MemWalTable:
        """A handle as given, or a URI opened without storage options (a local path, or the environment's
        credentials)."""
        return table if isinstance(table, MemWalTable) else cls(table)

    def __reduce__(self) -> tuple[Any, tuple]:
        return MemWalTable, (self.uri, self.storage_options)

    def __repr__(self) -> str:
        return f"MemWalTable({self.uri!r})"

    # --- what was opened ----------------------------------------------------------------------------

    @property
    def uri(self) -> str:
        return self.store.uri

    @property
    def storage_options(self) -> dict[str, str] | None:
        return self.store.storage_options or None

    @property
    def dataset(self) -> lance.LanceDataset:
        """The base table at the handle's version."""
        if self._dataset is None:
            try:
                self._dataset = lance.dataset(self.uri, version=self._version,
                                              storage_options=lance_storage_options(self.storage_options))
            except (OSError, ValueError) as exc:
                if self._version is None and is_table_not_found(exc):  # not Lance's text with Rust source paths
                    raise TableNotFoundError(self.uri) from exc
                raise
        return self._dataset

    @property
    def version(self) -> int:
        return self.dataset.version

    @property
    def schema(self) -> pa.Schema:
        return self.dataset.schema

    @cached_property
    def primary_key(self) -> list[str]:
        """The primary key columns; NoPrimaryKeyError naming the table if it has none."""
        return primary_key_columns(self.schema, where=self.uri)

    @property
    def index(self) -> MemWalIndex:
        """The MemWAL index at the handle's version (loaded once per version, `dataset_identity.cache_key`: a
        table recreated at the same URI and version is read anew); MemWalNotInitializedError."""
        identity = self._identity(self.dataset)
        if self._index is None or self._index_of != identity:
            self._index, self._index_of = index_of(self.dataset, self.store), identity
        return self._index

    def _identity(self, ds: lance.LanceDataset) -> tuple[str, int, int]:
        return cache_key(ds) or (self.uri, ds.version, 0)

    @property
    def details(self) -> MemWalIndexDetails:
        return self.index.details

    def refresh(self) -> MemWalTable:
        """Move to the latest version in place (the index is reloaded only if the version moved)."""
        if self._dataset is None:
            self.dataset  # noqa: B018 - a first open is already the latest
        else:
            self._dataset.checkout_latest()
        return self

    def checkout(self, version: int) -> MemWalTable:
        """Another handle on the same store at `version`, a dataset of its own (this one stays where it is; the
        MemWAL index already loaded for that version is shared)."""
        other = MemWalTable.__new__(MemWalTable)
        other.store, other._version, other._index, other._index_of, other._lease = self.store, version, None, None, None
        other._dataset = self.dataset.checkout_version(version)
        if self._index is not None and self._index_of == other._identity(other._dataset):
            other._index, other._index_of = self._index, self._index_of
        return other

    # --- regions, lock, index commit ----------------------------------------------------------------

    def regions(self) -> list[str]:
        return list_regions(self.store)

    def manifest(self, region_id: str) -> RegionManifest:
        """The region's latest manifest."""
        return load_latest_manifest(self.store, region_id)

    @contextmanager
    def index_lock(self) -> Iterator[TableLock]:
        """Hold the lock around every commit that changes the MemWAL index (merges and rewrites); while held,
        `check_lease` fences this handle's commits."""
        with index_lock(self.store) as lock:
            outer, self._lease = self._lease, lock
            try:
                yield lock
            finally:
                self._lease = outer

    def check_lease(self) -> None:
        """Right before a commit: LeaseLostError if the MemWAL index lock this handle holds was lost (taken
        over after a stall). A no-op outside the lock."""
        if self._lease is not None:
            self._lease.check()

    def commit_details(self, mutate: Callable[[MemWalIndexDetails], MemWalIndexDetails],
                       prepare: Callable[[str], None] | None = None) -> MemWalIndex:
        """Commit mutate(latest details) as a new table version, under the MemWAL index lock, without ever
        regressing progress.

        mutate must only change what its job owns (snapshot fields, index_catchup, config); progress it did
        not raise is taken from the latest version, and a rebase over a concurrent merge is repaired.
        prepare(entry_uuid), if given, runs before each commit attempt, e.g. to write _indices/{uuid}/ files.
        The handle ends at the committed version.
        """
        with self.index_lock():
            return self.commit_details_locked(mutate, prepare)

    def commit_details_locked(self, mutate: Callable[[MemWalIndexDetails], MemWalIndexDetails],
                              prepare: Callable[[str], None] | None = None) -> MemWalIndex:
        """`commit_details` for a caller that already holds the MemWAL index lock (compaction's round)."""
        floor: MemWalIndexDetails | None = None
        for attempt in range(mem_wal_index.MAX_COMMIT_ATTEMPTS):
            current = self.refresh().index
            proposed = mutate(current.details)
            if floor is not None:
                proposed = proposed.with_progress_at_least(floor)
            # never lower merged_generations by mutation
            proposed = proposed.with_progress_at_least(replace(current.details, index_catchup={}))
            entry_uuid = str(uuid.uuid4())
            if prepare is not None:
                prepare(entry_uuid)
            self.check_lease()
            ds = lance.LanceDataset.commit(
                self.uri, mem_wal_index.create_index_op(current, proposed, current.table_version, entry_uuid),
                read_version=current.table_version, storage_options=lance_storage_options(self.storage_options))
            fault_point("details.after_commit")
            if ds.version == current.table_version + 1:
                return self._adopt_committed(ds)
            # Other commits landed between our read and our commit: check what we overwrote.
            floor = mem_wal_index.fold_progress(self.store, range(current.table_version + 1, ds.version), floor)
            if floor is None or not proposed.progress_below(floor):
                return self._adopt_committed(ds)
            log.warning("details commit at version %d rebased over a concurrent merge (%s); repairing (attempt %d)",
                        ds.version, "; ".join(proposed.progress_below(floor)), attempt + 1)
        raise CommitConflictError(f"MemWAL index details of {self.uri} kept conflicting with concurrent commits")

    def _adopt_committed(self, ds: lance.LanceDataset) -> MemWalIndex:
        """The index as committed (read as it is: no monotone floor), now the handle's state."""
        index = index_of(ds, self.store, monotone=False)
        self.adopt(ds, index)
        return index

    def open_dataset(self, version: int | None = None, *, same_session: bool = False) -> lance.LanceDataset:
        """A dataset object of its own at `version` (default the latest), apart from the handle's: for a
        commit that must read at a fixed version while the handle moves on. same_session: it shares the
        handle's Lance session (its index and metadata caches): what it loads, the handle finds loaded."""
        session = self.dataset.session() if same_session else None
        return lance.dataset(self.uri, version=version, storage_options=lance_storage_options(self.storage_options),
                             session=session)

    def adopt(self, dataset: lance.LanceDataset, index: MemWalIndex | None = None) -> None:
        """Take a dataset this process just committed (and its index) as the handle's current state."""
        self._dataset, self._index = dataset, index
        self._index_of = self._identity(dataset) if index is not None else None

    def maintained_indexes(self) -> list[str]:
        """Base-table indexes the MemWAL maintains: the listed ones, or all of them (maintain_all_indexes)."""
        details = self.details
        if details.maintained_indexes:
            return list(details.maintained_indexes)
        if not details.maintain_all_indexes:
            return []
        return sorted({i.name for i in self.dataset.describe_indices() if i.name != naming.MEM_WAL_INDEX_NAME})


TableLike = MemWalTable | str
