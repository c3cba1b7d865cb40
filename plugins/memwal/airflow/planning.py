"""Pure planning for the DAGs: region batches for the maintenance merge and chunks for a backfill.

No I/O here (the rules are `memwal.planning`'s): the inputs are `memwal.status.pending_work` rows
(region_id, generations ascending, generation_bytes, rows, bytes), the outputs are what the mapped merge
tasks expand over.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memwal.planning import largest_first, leading_batch

__all__ = ["backfill_chunks", "region_batches"]


def region_batches(pending: Sequence[dict[str, Any]], max_batches: int) -> list[list[str]]:
    """Regions with pending work in at most `max_batches` groups of similar bytes (largest first into the
    lightest group), one Spark application each. Every region appears exactly once; ids sorted per batch.
    A region whose pending work could not be read (`error`) is batched too: its merge reports it."""
    work = sorted((p for p in pending if p.get("generations") or p.get("error")), key=lambda p: p["region_id"])
    if not work:
        return []
    groups = largest_first([int(p.get("bytes", 0)) for p in work], max_batches)
    return [sorted(work[i]["region_id"] for i in group) for group in groups]


def backfill_chunks(
    pending: Sequence[dict[str, Any]], max_generations: int | None, max_bytes: int | None
) -> list[dict[str, Any]]:
    """The backlog as bounded chunks, one merge (Spark application) each, in the order to run them:
    per region, consecutive generations (ascending) up to `max_generations` and `max_bytes` per chunk
    (always at least one generation). Each chunk: regions [id], up_to_generation, generations, bytes, rows
    (rows spread evenly: an estimate for display)."""
    chunks: list[dict[str, Any]] = []
    for p in sorted(pending, key=lambda p: p["region_id"]):
        gens: list[int] = list(p.get("generations") or [])
        sizes: list[int] = list(p.get("generation_bytes") or [0] * len(gens))
        rows_per_gen = int(p.get("rows", 0)) / len(gens) if gens else 0
        while gens:
            n = leading_batch(sizes, max_generations, max_bytes)
            chunks.append(_chunk(p["region_id"], gens[:n], sum(sizes[:n]), rows_per_gen))
            gens, sizes = gens[n:], sizes[n:]
    return chunks


def _chunk(region_id: str, gens: list[int], nbytes: int, rows_per_gen: float) -> dict[str, Any]:
    return {"regions": [region_id], "up_to_generation": gens[-1], "generations": [gens[0], gens[-1]],
            "bytes": nbytes, "rows": round(rows_per_gen * len(gens))}
