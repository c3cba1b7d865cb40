"""A merge's staged files: a worker's upserts or deleted keys as Arrow IPC files under a staging prefix
(`naming.STAGING_DIR/merge-<uuid4>/...`, in the table's store), read back by the driver at its commit or by
the fragment apply's tasks, and deleted once the commit was attempted (GC deletes an abandoned prefix).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pyarrow as pa

from memwal.storage import ObjectStore

__all__ = ["MAX_FILE_BYTES", "RoundStaging", "StagedFiles", "delete_staging", "ipc_bytes", "open_staged",
           "read_ipc_bytes", "unit_prefix"]

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 1 << 30  # a staged file is one record batch: its string columns stay within 32-bit offsets


class StagedFiles:
    """Arrow IPC files of one schema, rolled over at about file_bytes, written with ObjectStore. Each file is
    one record batch: a reader's columns are then single arrays, zero-copy from a memory map (every scan task
    of the fragment apply reads each file's key column; Spark hands a writer batches of 10,000 rows, and a file
    of those made each task copy every key of the backlog). `written`: (path, rows) per file."""

    def __init__(self, store: ObjectStore, prefix: str, schema: pa.Schema, file_bytes: int, tag: str):
        self.store, self.prefix, self.schema, self.tag = store, prefix, schema, tag
        self.file_bytes = min(file_bytes, MAX_FILE_BYTES)
        self.written: list[tuple[str, int]] = []
        self._pending: list[pa.Table] = []
        self._bytes = 0

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self._pending.append(table)
        self._bytes += table.nbytes
        if self._bytes >= self.file_bytes:
            self.finish()

    def finish(self) -> None:
        """Write what is pending as one more file (nothing when nothing is)."""
        if not self._pending:
            return
        table = pa.concat_tables(self._pending)
        if table.nbytes <= MAX_FILE_BYTES:  # else (one caller's table alone that large) written as it came
            table = table.combine_chunks()
        self._pending, self._bytes = [], 0
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, self.schema) as writer:
            writer.write_table(table)
        path = f"{self.prefix}/part-{self.tag}-{len(self.written):04d}.arrow"
        self.store.put(path, sink.getvalue().to_pybytes())
        self.written.append((path, table.num_rows))


def open_staged(store: ObjectStore, paths: Sequence[str], schema: pa.Schema) -> pa.Table:
    """The staged files as one table (read one after another, zero-copy); empty in `schema` if none."""
    tables = [pa.ipc.open_file(pa.py_buffer(store.get(path))).read_all() for path in paths]
    return pa.concat_tables(tables) if tables else schema.empty_table()


def delete_staging(store: ObjectStore, prefix: str) -> None:
    """Delete a staging prefix; a failure only logs (a leftover prefix is garbage for GC, not an error)."""
    try:
        store.delete_prefix(prefix)
    except Exception as exc:
        log.warning("could not delete the merge staging prefix %s: %s", prefix, exc)


def unit_prefix(prefix: str, unit: int) -> str:
    """Where one region batch (unit) of a job stages its files under the job's prefix."""
    return f"{prefix}/u{unit:05d}"


def ipc_bytes(table: pa.Table) -> bytes:
    """A table as an Arrow IPC stream: a small result carried inline instead of staged."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def read_ipc_bytes(blob: bytes | None, schema: pa.Schema) -> pa.Table:
    """The table of an `ipc_bytes` blob cast to `schema` (no blob: empty)."""
    return pa.ipc.open_stream(blob).read_all().cast(schema) if blob else schema.empty_table()


class RoundStaging:
    """The staging prefix of one batch job: each unit's files go when the unit is done, the prefix (with
    anything a failed task attempt left) when the last one is."""

    def __init__(self, store: ObjectStore, prefix: str, units: int):
        self.store, self.prefix, self.left = store, prefix, set(range(units))

    def done(self, unit: int, staged: bool = True) -> None:
        if unit not in self.left:
            return
        self.left.discard(unit)
        if not self.left:
            delete_staging(self.store, self.prefix)
        elif staged:
            delete_staging(self.store, unit_prefix(self.prefix, unit))
