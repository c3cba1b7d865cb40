"""What a base-table index covers, read from Lance (`describe_indices`: each segment's fragment ids), and
how readers of index_catchup use it.

The spec reads an index absent from index_catchup as caught up. An entry can be lost, though: Lance's
compaction remap drops every entry (pylance 14.0.2) and a failure before compaction puts them back leaves
none. So for an index that exists, "absent" is trusted only when the index covers every live fragment (then
it really is caught up to merged_generations of that version); otherwise it reads as 0 (not caught up).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import lance

from memwal.mem_wal_index import MemWalIndex

__all__ = ["covered_fragments", "covers_every_fragment", "live_fragments", "with_coverage"]


def live_fragments(ds: lance.LanceDataset) -> set[int]:
    """Ids of the fragments with live rows (from the manifest; a fragment whose deletion file does not say
    how many rows it deletes counts as live)."""
    out = set()
    for frag in ds.get_fragments():
        meta = frag.metadata
        deleted = meta.deletion_file.num_deleted_rows if meta.deletion_file is not None else 0
        if deleted is None or meta.physical_rows - deleted > 0:
            out.add(frag.fragment_id)
    return out


def covered_fragments(ds: lance.LanceDataset, name: str) -> set[int] | None:
    """Fragment ids the index `name` covers at ds's version; None when there is no such index."""
    for desc in ds.describe_indices():
        if desc.name == name:
            return {int(f) for seg in desc.segments for f in seg.fragment_ids}
    return None


def covers_every_fragment(ds: lance.LanceDataset, name: str) -> bool:
    """The index exists and covers every live fragment of ds's version."""
    covered = covered_fragments(ds, name)
    return covered is not None and live_fragments(ds) <= covered


def with_coverage(index: MemWalIndex, ds: lance.LanceDataset, names: Sequence[str]) -> MemWalIndex:
    """`index` (read at ds's version) with an empty index_catchup entry (every region 0) for each index of
    `names` that exists, has no entry and does not cover every live fragment; an index Lance does not have
    stays absent (nothing to wait for). GC and status read index_catchup through this."""
    missing = [n for n in names if n not in index.details.index_catchup]
    if not missing:
        return index
    described = {d.name: {int(f) for seg in d.segments for f in seg.fragment_ids} for d in ds.describe_indices()}
    live = live_fragments(ds) if any(n in described for n in missing) else set()
    behind = {n: {} for n in missing if n in described and not live <= described[n]}
    if not behind:
        return index
    return replace(index, details=replace(index.details, index_catchup={**index.details.index_catchup, **behind}))
