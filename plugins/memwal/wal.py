"""WAL entries: one Arrow IPC stream per WAL flush, at wal/{bit_reversed(position)}.arrow.

Schema metadata carries `writer_epoch` (for fencing on replay) and `generation` (Lance core writes it);
rows carry a non-null `_tombstone` column (true = delete by primary key). Positions start at 1, as
Lance core writes them, so that replay_after_wal_entry_position = 0 replays everything.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.ipc as ipc

from memwal import naming
from memwal.errors import CorruptFileError
from memwal.storage import ObjectStore

__all__ = ["WalEntry", "decode_wal_entry", "encode_wal_entry", "read_wal_entry", "scan_wal", "write_wal_entry"]

FIRST_POSITION = 1
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


@dataclass(frozen=True)
class WalEntry:
    position: int
    writer_epoch: int
    generation: int
    table: pa.Table  # the table's columns plus _tombstone
    size: int  # bytes on storage


def encode_wal_entry(table: pa.Table, writer_epoch: int, generation: int) -> bytes:
    """Serialise rows (with _tombstone) as an Arrow IPC stream with the fencing metadata."""
    metadata = dict(table.schema.metadata or {})
    metadata[naming.WRITER_EPOCH_KEY] = str(writer_epoch).encode()
    metadata[naming.GENERATION_KEY] = str(generation).encode()
    table = table.replace_schema_metadata(metadata)
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode_wal_entry(data: bytes, path: str, position: int) -> WalEntry:
    """Parse one WAL entry; CorruptFileError (naming the path) if truncated or missing metadata.

    A stream cut at a message boundary still parses (with rows missing), so the end-of-stream marker
    that every writer (ours, Lance core's) ends an entry with is required.
    """
    if not data.endswith(_END_OF_STREAM):
        raise CorruptFileError(path, "truncated: no Arrow IPC end-of-stream marker")
    try:
        reader = ipc.open_stream(pa.BufferReader(data))
        table = reader.read_all()
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
        raise CorruptFileError(path, f"not a complete Arrow IPC stream ({exc})") from exc
    metadata = table.schema.metadata or {}
    try:
        epoch = int(metadata[naming.WRITER_EPOCH_KEY])
    except (KeyError, ValueError) as exc:
        raise CorruptFileError(path, "schema metadata has no integer writer_epoch") from exc
    generation = int(metadata.get(naming.GENERATION_KEY, b"0") or 0)
    if naming.TOMBSTONE_COLUMN not in table.column_names:
        raise CorruptFileError(path, f"no {naming.TOMBSTONE_COLUMN} column")
    return WalEntry(position, epoch, generation, table, len(data))


def write_wal_entry(store: ObjectStore, region_id: str, position: int, data: bytes) -> None:
    """Create the entry with put-if-not-exists; AlreadyExistsError if the position is taken."""
    store.put_if_not_exists(naming.wal_entry_path(region_id, position), data)


def read_wal_entry(store: ObjectStore, region_id: str, position: int) -> WalEntry | None:
    """The entry at position, or None if there is none."""
    path = naming.wal_entry_path(region_id, position)
    try:
        data = store.get(path)
    except FileNotFoundError:
        return None
    return decode_wal_entry(data, f"{store.uri}/{path}", position)


def scan_wal(store: ObjectStore, region_id: str, after_position: int) -> Iterator[WalEntry]:
    """Entries after_position+1, +2, ... until the first missing position (the spec's replay order)."""
    position = max(after_position + 1, FIRST_POSITION)
    while True:
        entry = read_wal_entry(store, region_id, position)
        if entry is None:
            return
        yield entry
        position += 1


def list_wal_positions(store: ObjectStore, region_id: str) -> list[int]:
    """Every WAL position present in storage, ascending (for GC and status, not for replay)."""
    return naming.list_bit_reversed(store.list_files(naming.wal_dir(region_id)), naming.WAL_SUFFIX)
