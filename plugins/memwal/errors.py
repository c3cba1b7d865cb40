"""Every error this library raises. Each docstring tells the caller what to do next."""

from __future__ import annotations


class MemWalError(Exception):
    """Base class: something about a MemWAL table is not as the spec requires."""


class BadInputError(MemWalError, ValueError):
    """An argument or setting is invalid (the message names the parameter and its value), or names a table,
    region or index that does not exist. Fix the input: retrying cannot help (`memwal` exits 2)."""


class TableNotFoundError(BadInputError):
    """No Lance table at the URI. Check the URI and the storage options (endpoint, bucket, credentials)."""

    def __init__(self, table_uri: str):
        super().__init__(f"table {table_uri} not found: no Lance dataset there; check the table URI and the "
                         "storage options")
        self.table_uri = table_uri


def is_table_not_found(exc: BaseException) -> bool:
    """Lance's error for opening a dataset that does not exist (`Dataset at path ... was not found: ...`)."""
    low = str(exc).lower()
    return "dataset at" in low and "was not found" in low


class CorruptFileError(MemWalError):
    """A manifest, WAL entry or index could not be parsed. Nothing was changed; inspect or restore the file."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"corrupt or truncated file {path}: {reason}")
        self.path = path
        self.reason = reason


class AlreadyExistsError(MemWalError):
    """A create-only put lost the race: the object exists. Reload the latest state and retry."""

    def __init__(self, path: str):
        super().__init__(f"{path} already exists (another process committed it first)")
        self.path = path


class ObjectStoreError(MemWalError):
    """The object store kept failing one request after the client's retries (5xx, timeouts, resets). The
    message names the table, the operation, the object and the last fault. What committed before stays;
    rerun the step once the store answers again (the retries are set by `client_max_retries` and
    `client_retry_timeout` in the storage options, docs/safety.md)."""

    def __init__(self, table_uri: str, operation: str, path: str, fault: str):
        super().__init__(f"object store {operation} of {path or '/'} in table {table_uri} failed: {fault}")
        self.table_uri = table_uri
        self.operation = operation
        self.path = path
        self.fault = fault


class CommitConflictError(MemWalError):
    """A commit kept losing to concurrent commits. Reload and retry later."""


class LockTimeoutError(CommitConflictError):
    """Gave up waiting for a lock another job holds (the MemWAL index lock: a long compaction round, another
    merge, or a holder that stalls while renewing its lease). This step committed nothing; what committed
    before it stays. Rerun later; a compaction round holds the lock for up to `max_tasks_per_round` tasks."""

    def __init__(self, lock: str, owner: str, waited_s: float):
        super().__init__(f"lock {lock} is held by {owner}; gave up after waiting {waited_s:.0f}s. Nothing was "
                         "committed by this step; rerun it later (lower compaction.max_tasks_per_round to "
                         "shorten the compaction rounds that hold this lock)")
        self.lock = lock
        self.owner = owner
        self.waited_s = waited_s


class LeaseLostError(CommitConflictError):
    """This job's lease on a lock was taken over (it stalled past the lease and another job took the lock):
    the commit it was about to make was not made. What it committed before stays; rerun the job."""

    def __init__(self, lock: str, owner: str, why: str):
        super().__init__(f"lock {lock}: our lease ({owner}) {why}; stopped before the next commit (nothing more "
                         "was committed by this job); rerun it")
        self.lock = lock
        self.owner = owner


class FencedError(MemWalError):
    """This writer's epoch is older than the region's: another writer owns the region. Stop writing."""

    def __init__(self, region_id: str, local_epoch: int, stored_epoch: int):
        super().__init__(
            f"writer fenced on region {region_id}: local writer_epoch {local_epoch} < stored {stored_epoch}"
        )
        self.region_id = region_id
        self.local_epoch = local_epoch
        self.stored_epoch = stored_epoch


class RegionNotFoundError(MemWalError):
    """The region has no manifest under _mem_wal/. Check the region id (a UUID) and the table URI."""

    def __init__(self, region_id: str, where: str):
        super().__init__(f"region {region_id} not found: no manifest under {where}")
        self.region_id = region_id


class MemWalNotInitializedError(MemWalError):
    """The base table has no __lance_mem_wal index. Initialise MemWAL on the table first."""

    def __init__(self, table_uri: str):
        super().__init__(f"table {table_uri} has no MemWAL index (__lance_mem_wal); initialise MemWAL first")
        self.table_uri = table_uri


class NoPrimaryKeyError(MemWalError):
    """The schema has no unenforced primary key. Mark the key column(s) with lance-schema:unenforced-primary-key."""


class InvalidPrimaryKeyError(MemWalError):
    """The primary key field metadata contradicts itself (see memwal.primary_key). Fix the named columns' metadata."""


class RegionSpecError(MemWalError):
    """A region spec is invalid (unknown transform, missing parameter, unknown source field). Fix the spec."""


class MissingGenerationError(MemWalError):
    """A flushed generation listed in a region manifest has no readable directory. It may have been GC'd."""

    def __init__(self, region_id: str, generation: int, path: str, reason: str = "missing"):
        super().__init__(f"generation {generation} of region {region_id} at {path}: {reason}")
        self.region_id = region_id
        self.generation = generation
        self.path = path


class WriterClosedError(MemWalError):
    """The writer was closed (or aborted after being fenced). Open a new writer."""


def one_line(text: object, limit: int = 500) -> str:
    """A message (or exception) on one line, at most `limit` characters: for task errors and logs."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
