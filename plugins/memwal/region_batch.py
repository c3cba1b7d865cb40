"""One region batch (consecutive generations of one region bound for one commit) deduplicated where a worker
runs it, and turned back into a `MergeInput` on the driver; nothing here knows Spark.

Worker (`stage_region_batch`): read the generations, keep the newest row per key (`memwal.merge.dedup_generations`,
the in-process merge's own code), then either keep the result inline (a small batch: Arrow IPC blobs in the
result) or write the upserts, already in the base schema, and the deleted keys as staged files
(`memwal.staged_files`) and return only their paths and counts. Driver (`batch_input`): the `MergeInput` of
that result, or the batch's error when it failed or its files do not add up to its counts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from memwal.errors import MemWalError
from memwal.merge import GenerationRef, MergeInput, dedup_batch, read_generation
from memwal.staged_files import RoundStaging, StagedFiles, ipc_bytes, open_staged, read_ipc_bytes
from memwal.storage import ObjectStore

__all__ = ["TIMES", "StagedBatch", "batch_input", "stage_region_batch"]

TIMES = ("read_s", "dedup_s", "stage_s")  # a worker's seconds per step, in StagedBatch.times


@dataclass
class StagedBatch:
    """What a worker returns for one region batch: counts, and the staged files or the inline blobs."""

    inline: bool = False  # the result travels in the blobs, nothing is staged
    upserts: int = 0  # rows (staged, or inline)
    deleted: int = 0  # deleted keys staged (inline ones travel in `inline_deleted`)
    rows_read: int = 0
    files: list[tuple[str, int]] = field(default_factory=list)  # (path, rows) of the staged upserts
    deleted_files: list[tuple[str, int]] = field(default_factory=list)  # of the staged deleted keys
    inline_upserts: bytes | None = None  # Arrow IPC stream (`staged_files.ipc_bytes`), when inline
    inline_deleted: bytes | None = None
    times: tuple[float, float, float] = (0.0, 0.0, 0.0)  # TIMES
    # the lowest generation holding a winning upsert and a winning tombstone (`memwal.merge.lowest_winners`),
    # or None when not known: which pass may carry the first marker step (`MergeInput.winners`)
    lowest: tuple[int | None, int | None] | None = None


def stage_region_batch(store: ObjectStore, refs: Sequence[GenerationRef], pk: list[str], schema: pa.Schema, *,
                       prefix: str, tag: str, inline: bool, file_bytes: int, batch_rows: int) -> StagedBatch:
    """The worker's part: read, dedup, then stage under `prefix` (files tagged `tag`, in batches of at most
    `batch_rows` rows) or, when `inline`, return the result in the blobs."""
    t0 = time.perf_counter()
    tables = [read_generation(r, store) for r in refs]
    t1 = time.perf_counter()
    upserts, deletes, n, lowest = dedup_batch(tables, pk, schema)
    del tables
    t2 = time.perf_counter()
    out = StagedBatch(inline=inline, upserts=upserts.num_rows, rows_read=n, lowest=lowest)
    if inline:
        out.inline_upserts = ipc_bytes(upserts) if upserts.num_rows else None
        out.inline_deleted = ipc_bytes(deletes) if deletes.num_rows else None
    else:
        staged = StagedFiles(store, prefix, schema, file_bytes, tag)
        for chunk in upserts.to_batches(max_chunksize=batch_rows):
            staged.write(pa.Table.from_batches([chunk], schema))
        staged.finish()
        keys = StagedFiles(store, prefix, deletes.schema, file_bytes, f"deleted-{tag}")
        keys.write(deletes)  # staged too: the driver gets paths and counts
        keys.finish()
        out.files, out.deleted_files, out.deleted = staged.written, keys.written, deletes.num_rows
    out.times = (t1 - t0, t2 - t1, time.perf_counter() - t2)
    return out


def batch_input(store: ObjectStore, refs: Sequence[GenerationRef], result: StagedBatch | str, schema: pa.Schema,
                pk: list[str], staging: RoundStaging, unit: int) -> MergeInput | MemWalError:
    """The driver's part: the batch's `MergeInput` (staged upserts opened only at its commit; `cleanup()`
    deletes its files), or its error (`result` a message: the worker failed; or staged files that do not
    add up to the worker's counts). A failed or inline batch's files are deleted here."""
    region, gens = refs[0].region_id, [r.generation for r in refs]
    winners = {region: result.lowest} if isinstance(result, StagedBatch) and result.lowest is not None else {}
    key_schema = pa.schema([schema.field(c) for c in pk])
    if isinstance(result, str):
        staging.done(unit)
        return MemWalError(f"region {region}: Spark dedup of generations {gens} failed: {result}")
    if result.inline:
        staging.done(unit, staged=False)
        upserts = read_ipc_bytes(result.inline_upserts, schema)
        deleted = read_ipc_bytes(result.inline_deleted, key_schema)
        return MergeInput(open_upserts=(lambda: upserts), deleted_keys=deleted, rows_read=result.rows_read,
                          winners=winners)
    staged, staged_deleted = sum(n for _, n in result.files), sum(n for _, n in result.deleted_files)
    if staged != result.upserts or staged_deleted != result.deleted:
        staging.done(unit)
        return MemWalError(f"region {region}: Spark dedup of generations {gens} staged {staged} of "
                           f"{result.upserts} rows and {staged_deleted} of {result.deleted} deleted keys")
    paths = [p for p, _ in sorted(result.files)]
    return MergeInput(
        open_upserts=(lambda: open_staged(store, paths, schema)),
        deleted_keys=key_schema.empty_table(),
        rows_read=result.rows_read,
        cleanup=(lambda: staging.done(unit)),
        staged=tuple(paths),
        staged_rows=result.upserts,
        staged_deleted=tuple(p for p, _ in sorted(result.deleted_files)),
        staged_deleted_rows=staged_deleted,
        winners=winners,
    )
