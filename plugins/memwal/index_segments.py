"""Index segments: how many each index has, when catch-up folds them, what blocks compaction, and the
explicit rebuild of a vector index.

Catch-up's `optimize_indices(num_indices_to_merge=0)` appends a delta segment to a vector index (scalar and
FTS indexes are merged by default; `fold_options` says why never Lance's default on a vector index), and
Lance's compaction does not combine fragments covered by different
segments of one index. Catch-up therefore folds an index's newest segments into one (Lance's
`num_indices_to_merge`: the trained centroids and codebook are reused, nothing is retrained) when it has,
or would have after the append, more than the policy's `max_segments` (`memwal.maintenance_config.IndexPolicy`),
or when compaction is due and the index's segments split the fragments it would combine (`indices_to_merge`).
`rebuild_vector_index` retrains a vector index with the parameters the existing one reports.
"""

from __future__ import annotations

import logging
from typing import Any

import lance

from memwal import naming
from memwal.fragment_health import due_reasons, fragment_health, is_small
from memwal.index_statistics import index_statistics
from memwal.maintenance_config import CompactionConfig, IndexPolicy

__all__ = ["VECTOR_REBUILD_TYPES", "blocking_indexes", "fold_options", "indices_to_merge", "is_vector_index",
           "rebuild_vector_index", "segment_counts"]

log = logging.getLogger(__name__)

# Vector index types rebuilt with the parameters their stats report (pylance 14.0.2).
VECTOR_REBUILD_TYPES = ("IVF_FLAT", "IVF_PQ", "IVF_SQ", "IVF_HNSW_FLAT", "IVF_HNSW_PQ", "IVF_HNSW_SQ")


def segment_counts(ds: lance.LanceDataset) -> dict[str, int]:
    """Segments per index of the table (the MemWAL system index left out), from the manifest."""
    return {d.name: len(d.segments) for d in ds.describe_indices() if d.name != naming.MEM_WAL_INDEX_NAME}


def indices_to_merge(segments: int, appending: bool, max_segments: int | None, newest_small: int = 0,
                     blocked: bool = False) -> int | None:
    """Lance's `num_indices_to_merge` for one catch-up of an index with `segments` segments (None: Lance's
    default, no fold). Folds when the bound is or would be exceeded after the append, or when the index
    blocks a due compaction (`blocked`): the newest segments into one, enough of them to get within the
    bound and at least the `newest_small` newest (back to the oldest segment covering a small fragment, so
    compaction can then combine those fragments). Older segments over large fragments stay as they are."""
    if max_segments is None or (segments + (1 if appending else 0) <= max_segments and not blocked):
        return None
    return min(segments, max(segments - max_segments + 1, newest_small, 1))


def _small_fragments(ds: lance.LanceDataset, target_rows_per_fragment: int) -> set[int]:
    """Fragments compaction would combine (`memwal.fragment_health.is_small`)."""
    return {f.fragment_id for f in ds.get_fragments() if is_small(f.metadata, target_rows_per_fragment)}


def fold_options(ds: lance.LanceDataset, name: str, policy: IndexPolicy, appending: bool,
                 compaction: CompactionConfig | None = None) -> dict[str, int]:
    """The `optimize_indices` keyword arguments of catch-up for index `name`: `num_indices_to_merge` by
    `indices_to_merge` ("small" and "due" by `compaction`'s rules, default CompactionConfig()); when nothing
    folds, 0 for a vector index (a delta segment over the trained model) and nothing for the others.

    Never Lance's default for a vector index: pylance 14's `optimize_indices()` without
    `num_indices_to_merge` rebuilt a 64-partition IVF_PQ over 44,000 rows as one segment of 2 partitions
    (recall@10 at nprobes 1 from 0.60 to 0.24; at 100,000 rows, 78 partitions became 1: every query then
    reads every PQ code), where 0 appends a 64-partition delta (tests/library/test_index_segments.py)."""
    desc = next((d for d in ds.describe_indices() if d.name == name), None)
    if desc is None:
        return {}
    limit = policy.limit(name)
    n = None
    if limit is not None:
        config = compaction or CompactionConfig()
        small = _small_fragments(ds, config.target_rows_per_fragment)
        covering = [i for i, seg in enumerate(desc.segments) if small & {int(f) for f in seg.fragment_ids}]
        segments = len(desc.segments)
        # the delta an append adds covers the new (small) fragments too: it would split them from the rest
        blocked = (len(covering) + (1 if appending else 0) > 1 and config.enabled
                   and bool(due_reasons(fragment_health(ds, config.target_rows_per_fragment), config)))
        n = indices_to_merge(segments, appending, limit, segments - covering[0] if covering else 0, blocked)
        if n is not None:
            log.info("index %s: folding the newest %d of %d segments (%s)", name, n, segments,
                     "they block a due compaction" if blocked else f"bound {limit}")
    if n is None:
        return {"num_indices_to_merge": 0} if is_vector_index(desc) else {}
    return {"num_indices_to_merge": n}


def blocking_indexes(ds: lance.LanceDataset, target_rows_per_fragment: int) -> tuple[dict[str, int], dict[str, int]]:
    """Why Lance plans no task across the fragments compaction would combine (those under half the target
    rows), in one pass over the indexes:
    - segments: indexes whose segments split them into more than one group -> the index's segment count
      (the next catch-up folds them);
    - unindexed: indexes that cover some of them and not others -> how many they do not cover (Lance does not
      combine an indexed fragment with an unindexed one, any index type; the next catch-up covers them)."""
    small = _small_fragments(ds, target_rows_per_fragment)
    segments: dict[str, int] = {}
    unindexed: dict[str, int] = {}
    for d in ds.describe_indices():
        if d.name == naming.MEM_WAL_INDEX_NAME:
            continue
        per_segment = [small & {int(f) for f in seg.fragment_ids} for seg in d.segments]
        if sum(1 for covered in per_segment if covered) > 1:
            segments[d.name] = len(d.segments)
        covered = set().union(*per_segment)
        if covered and small - covered:
            unindexed[d.name] = len(small - covered)
    return segments, unindexed


def is_vector_index(desc: Any) -> bool:
    """A vector (IVF family) index, by its Lance type."""
    return "vector" in desc.type_url.lower() or str(desc.index_type).upper().startswith("IVF")


def rebuild_vector_index(ds: lance.LanceDataset, name: str) -> dict[str, Any]:
    """Retrain vector index `name` from scratch (Lance samples the rows to train on) with the parameters
    the existing index reports: type, metric, partitions, sub-vectors, bits, HNSW's m and ef_construction.
    Returns the parameters used; ValueError naming the index when they cannot be read faithfully."""
    desc = next((d for d in ds.describe_indices() if d.name == name), None)
    if desc is None:
        raise ValueError(f"no index named {name}")
    index_type = str(desc.index_type).upper()
    if index_type not in VECTOR_REBUILD_TYPES or len(desc.field_names) != 1:
        raise ValueError(f"index {name} ({desc.index_type} on {', '.join(desc.field_names)}): rebuilding it is not "
                         f"supported (vector types: {', '.join(VECTOR_REBUILD_TYPES)}, on one column)")
    details = desc.details or {}
    segments = index_statistics(ds, name).get("segments") or []
    partitions = [s.get("num_partitions") for s in segments if s.get("num_partitions")]
    metric = details.get("metric_type") or (segments[0].get("metric_type") if segments else None)
    if not partitions or not metric:
        raise ValueError(f"index {name} ({index_type}): Lance reports no partition count or metric; not rebuilt "
                         "(rebuild it by hand with create_index)")
    params: dict[str, Any] = {"metric": str(metric).lower(), "num_partitions": max(partitions)}
    compression = details.get("compression") or {}
    if index_type.endswith("_PQ"):
        if not compression.get("num_sub_vectors"):
            raise ValueError(f"index {name} ({index_type}): Lance reports no num_sub_vectors; not rebuilt")
        params["num_sub_vectors"] = int(compression["num_sub_vectors"])
    if compression.get("num_bits") and not index_type.endswith("_FLAT"):
        params["num_bits"] = int(compression["num_bits"])
    if "HNSW" in index_type:
        hnsw = details.get("hnsw") or {}
        if not hnsw.get("max_connections") or not hnsw.get("construction_ef"):
            raise ValueError(f"index {name} ({index_type}): Lance reports no HNSW m / ef_construction; not rebuilt")
        params.update(m=int(hnsw["max_connections"]), ef_construction=int(hnsw["construction_ef"]))
    ds.create_index(desc.field_names[0], index_type, name=name, replace=True, **params)
    log.info("index %s (%s) rebuilt and retrained with %s", name, index_type, params)
    return {"index_type": index_type, **params}
