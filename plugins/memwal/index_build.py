"""Index segments built in parallel: catch-up's distributed path (issue 24), lance-ray's shape on our TaskRunner.

Three steps, as every distributed operation here (STYLE):
- plan (driver): at table version V0, the live fragments index `name` does not cover, split into groups
  balanced by rows (`plan_groups`); for the IVF family the existing index's trained model (centroids, PQ
  codebook, metric, HNSW parameters: `vector_model`), for INVERTED its tokenizer, so every segment agrees
  with the index it joins;
- tasks (anywhere, through a `memwal.task_runner.TaskRunner`): each opens V0 and builds one uncommitted
  segment over its group's fragments with Lance's `create_index_uncommitted(..., fragment_ids=...)`
  (INVERTED: its partial files merged by `merge_existing_index_segments`), writes only under
  `_indices/<new uuid>/` and returns the segment's metadata (`lance.dataset.Index`). Groups are disjoint, so
  no two tasks cover a fragment;
- commit (driver): one `LanceOperation.CreateIndex(new_indices=segments, removed_indices=[])` at read_version
  V0 under the MemWAL index lock; the segments join the index of that name. The caller (catch-up) then
  records index_catchup by its rule (only when the index covers every fragment of V0).

A concurrent commit: a merge appends fragments after V0 (left uncovered, the next catch-up's); a compaction
that rewrote a planned fragment makes Lance refuse the commit (the index stays as it was). A crash or a
failed task before the commit leaves the index as it was; the written segment directories are referenced by
no version and go with retention's cleanup of unreferenced files.

What Lance 14.0.2 cannot build per fragment group is left to the in-process `optimize_indices` (`fallback`):
IVF_SQ and IVF_HNSW_SQ (a segment trains its own scalar-quantizer bounds, none can be passed in, and Lance
refuses to fold segments whose quantizers differ), index types without a segment build, and indexes on more
than one column.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import lance
import numpy as np

from memwal.faults import fault_point
from memwal.index_statistics import index_statistics
from memwal.storage import lance_storage_options
from memwal.task_runner import TaskRunner

if TYPE_CHECKING:
    from memwal.table import MemWalTable

__all__ = ["DISTRIBUTED_MIN_ROWS", "MIN_GROUP_ROWS", "SEGMENT_TYPES", "BuildPlan", "SegmentTask", "build_segment",
           "build_segments", "commit_segments", "describe", "fallback", "min_rows", "plan_build", "plan_groups",
           "vector_model"]

log = logging.getLogger(__name__)

# Catch-up takes the distributed path for an index with at least this many rows to index, by kind
# (bench/index.py --threshold on a quiet 2-core machine, Spark local[2] against in process, counting the ~8 s
# a catch-up job pays to start its Spark application and executors' Python workers: the vector build repaid
# it at about 1.5M rows (in process 9.9-20 s, Spark 5.9 + 8 s); the FTS build, 1.6-2x faster on local[2] at
# every size measured, repays it from about 7M rows by the measured slope; the default sits lower as a
# cluster brings more than two cores). spark.memwal.indexBuildMinRows sets one for every kind (spark_jobs.catchup).
DISTRIBUTED_MIN_ROWS = {"vector": 1_500_000, "scalar": 4_000_000}
# A group (one task, one segment) gets at least this many rows, so small work is not spread thin.
MIN_GROUP_ROWS = 20_000

# Lance index types (normalised) built per fragment group; the value is the type create_index_uncommitted takes.
SEGMENT_TYPES = {"BTREE": "BTREE", "BITMAP": "BITMAP", "LABELLIST": "LABEL_LIST", "LABEL_LIST": "LABEL_LIST",
                 "INVERTED": "INVERTED", "FTS": "INVERTED", "IVF_FLAT": "IVF_FLAT", "IVF_PQ": "IVF_PQ",
                 "IVF_HNSW_FLAT": "IVF_HNSW_FLAT", "IVF_HNSW_PQ": "IVF_HNSW_PQ"}
_NOT_PER_GROUP = {
    "IVF_SQ": "pylance 14 trains a scalar quantizer per segment (its bounds cannot be passed in) and refuses to "
              "fold segments whose quantizers differ",
}
_NOT_PER_GROUP["IVF_HNSW_SQ"] = _NOT_PER_GROUP["IVF_SQ"]
# The tokenizer settings an INVERTED index reports (describe_indices details) that its segments must share.
_TOKENIZER_KEYS = ("base_tokenizer", "language", "with_position", "max_token_length", "lower_case", "stem",
                   "remove_stop_words", "custom_stop_words", "ascii_folding", "min_ngram_length", "max_ngram_length",
                   "prefix_only")


def normalized_type(desc: Any) -> str:
    """The index's Lance type, upper case without separators Lance's names differ by (LabelList: LABELLIST)."""
    return str(desc.index_type).upper().replace(" ", "")


def describe(ds: lance.LanceDataset, name: str) -> Any:
    """Lance's description of index `name` at ds's version; ValueError naming the index and the version when
    the table has no such index (dropped), never StopIteration (which would escape a caller's handlers)."""
    for desc in ds.describe_indices():
        if desc.name == name:
            return desc
    raise ValueError(f"index {name}: not on the base table {ds.uri} at version {ds.version}")


def min_rows(desc: Any) -> int:
    """The rows to index from which index `desc` is built in parallel (`DISTRIBUTED_MIN_ROWS` of its kind)."""
    return DISTRIBUTED_MIN_ROWS["vector" if normalized_type(desc).startswith("IVF") else "scalar"]


def fallback(desc: Any) -> str | None:
    """Why index `desc` (from describe_indices) is not built per fragment group (None: it is)."""
    kind = normalized_type(desc)
    if kind in _NOT_PER_GROUP:
        return f"{desc.index_type}: {_NOT_PER_GROUP[kind]}"
    if kind not in SEGMENT_TYPES:
        return f"{desc.index_type}: no per-fragment segment build for this type here"
    if len(desc.field_names) != 1:
        return f"{desc.index_type} on {', '.join(desc.field_names)}: on more than one column"
    bits = ((desc.details or {}).get("compression") or {}).get("num_bits")
    if kind.endswith("_PQ") and bits not in (None, 8):
        return f"{desc.index_type} with {bits}-bit PQ: only an 8-bit codebook is passed to the segments here"
    return None


def fragment_rows(ds: lance.LanceDataset) -> dict[int, int]:
    """Live rows per fragment, from the manifest."""
    out = {}
    for frag in ds.get_fragments():
        meta = frag.metadata
        deleted = meta.deletion_file.num_deleted_rows if meta.deletion_file is not None else 0
        out[frag.fragment_id] = meta.physical_rows - (deleted or 0)
    return out


def plan_groups(rows: dict[int, int], groups: int) -> list[list[int]]:
    """Fragment ids split into at most `groups` non-empty groups with balanced rows (largest first onto the
    lightest group); each group's ids sorted, groups ordered by their first id."""
    out: list[list[int]] = [[] for _ in range(max(1, min(groups, len(rows))))]
    load = [0] * len(out)
    for fid, n in sorted(rows.items(), key=lambda kv: (-kv[1], kv[0])):
        i = min(range(len(out)), key=lambda j: (load[j], j))
        out[i].append(fid)
        load[i] += n
    return sorted((sorted(g) for g in out if g), key=lambda g: g[0])


def _pb_tensor(buf: bytes) -> tuple[list[int], bytes]:
    """(shape, data) of a serialised lance pb.Tensor {data_type = 1, repeated shape = 2, data = 3}."""
    shape: list[int] = []
    data = b""
    i = 0

    def varint(b: bytes, j: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            byte = b[j]
            j += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value, j

    while i < len(buf):
        key, i = varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(buf, i)
            if number == 2:
                shape.append(value)
        elif wire == 2:
            n, i = varint(buf, i)
            chunk = buf[i:i + n]
            i += n
            if number == 2:  # packed shape
                j = 0
                while j < len(chunk):
                    value, j = varint(chunk, j)
                    shape.append(value)
            elif number == 3:
                data = bytes(chunk)
        else:
            raise ValueError(f"unexpected protobuf wire type {wire} in a PQ codebook tensor")
    return shape, data


def vector_model(ds: lance.LanceDataset, name: str, table: MemWalTable | None = None) -> dict[str, Any]:
    """The trained model of vector index `name` as `create_index_uncommitted` takes it: metric,
    num_partitions, ivf_centroids (Lance's index statistics), for PQ num_sub_vectors and pq_codebook (the
    codebook tensor in the segment's auxiliary.idx, laid out (sub_vectors, 256, dim / sub_vectors)), for HNSW
    m and ef_construction (the codebook is read with `table`'s storage options). ValueError naming the index
    when Lance does not report it."""
    desc = describe(ds, name)
    kind = normalized_type(desc)
    segments = index_statistics(ds, name, centroids=True).get("segments") or []
    if not segments or not segments[0].get("centroids"):
        raise ValueError(f"index {name} ({desc.index_type}): Lance reports no IVF centroids")
    first = segments[0]
    details = desc.details or {}
    metric = details.get("metric_type") or first.get("metric_type") or "l2"
    params: dict[str, Any] = {"metric": str(metric).lower(), "num_partitions": int(first["num_partitions"]),
                              "ivf_centroids": np.asarray(first["centroids"], dtype=np.float32)}
    if kind.endswith("_PQ"):
        from lance.file import LanceFileReader

        reader = LanceFileReader(f"{ds.uri.rstrip('/')}/_indices/{first['uuid']}/auxiliary.idx",
                                 storage_options=lance_storage_options(table and table.storage_options))
        meta = json.loads(json.loads(reader.metadata().schema.metadata[b"storage_metadata"])[0])
        shape, data = _pb_tensor(bytes(reader.read_global_buffer(meta["codebook_position"])))
        m, dim, bits = int(meta["num_sub_vectors"]), int(meta["dimension"]), int(meta.get("nbits", 8))
        if bits != 8 or len(data) != 4 * (1 << bits) * dim:
            raise ValueError(f"index {name} ({desc.index_type}): a PQ codebook of shape {shape}, {bits} bits, "
                             f"{len(data)} bytes is not one this build can pass back to Lance")
        params.update(num_sub_vectors=m,
                      pq_codebook=np.frombuffer(data, dtype=np.float32).reshape(m, 1 << bits, dim // m).copy())
    if "HNSW" in kind:
        hnsw = details.get("hnsw") or {}
        if hnsw.get("max_connections"):
            params["m"] = int(hnsw["max_connections"])
        if hnsw.get("construction_ef"):
            params["ef_construction"] = int(hnsw["construction_ef"])
    return params


@dataclass(frozen=True)
class SegmentTask:
    """One task: build index `index_name`'s segment over `fragment_ids` of version `read_version` of `table`
    (the handle pickles to its URI and storage options: the task opens the table where it runs)."""

    table: MemWalTable
    read_version: int
    index_name: str
    column: str
    index_type: str  # as create_index_uncommitted takes it
    fragment_ids: tuple[int, ...]
    params: dict[str, Any] = field(default_factory=dict)  # the existing index's model / tokenizer
    threads: int | None = None  # Lance's CPU threads in the task (the task's cores); None: Lance's default


@dataclass
class BuildPlan:
    """The distributed build of one index at version `read_version`: one task per group."""

    index_name: str
    read_version: int
    rows: int
    tasks: list[SegmentTask]


def plan_build(table: MemWalTable, ds0: lance.LanceDataset, name: str, uncovered: Sequence[int], groups: int,
               threads: int | None = None, min_group_rows: int = MIN_GROUP_ROWS) -> BuildPlan:
    """The tasks building index `name`'s segments over the `uncovered` fragments of ds0 (`table` at the
    version the build reads): at most `groups` groups, each of at least `min_group_rows` rows (one group when
    there are fewer)."""
    desc = describe(ds0, name)
    reason = fallback(desc)
    if reason:
        raise ValueError(f"index {name}: {reason}")
    kind = SEGMENT_TYPES[normalized_type(desc)]
    all_rows = fragment_rows(ds0)
    rows = {f: all_rows.get(f, 0) for f in uncovered}
    total = sum(rows.values())
    n = max(1, min(groups, total // max(1, min_group_rows)))
    if kind.startswith("IVF"):
        params = vector_model(ds0, name, table)
    elif kind == "INVERTED":
        details = desc.details or {}
        params = {k: details[k] for k in _TOKENIZER_KEYS if details.get(k) is not None}
    else:
        params = {}
    tasks = [SegmentTask(table, ds0.version, name, desc.field_names[0], kind, tuple(g), params, threads)
             for g in plan_groups(rows, n)]
    return BuildPlan(name, ds0.version, total, tasks)


def build_segment(task: SegmentTask) -> Any:
    """Build one uncommitted segment (runs in a task): only files under `_indices/<new uuid>/` are written.
    Returns Lance's `Index` metadata of the segment."""
    if task.threads:
        # Read when Lance starts its CPU pool (the first Lance work of this process, e.g. a fresh executor
        # worker); sizes Lance to the task's cores so tasks sharing an executor do not oversubscribe it.
        os.environ.setdefault("LANCE_CPU_THREADS", str(task.threads))
    ds = task.table.open_dataset(task.read_version)
    segment = ds.create_index_uncommitted(task.column, task.index_type, name=task.index_name, replace=True,
                                          fragment_ids=list(task.fragment_ids), **task.params)
    if task.index_type == "INVERTED":  # its partial files are merged into the segment's own files
        segment = ds.merge_existing_index_segments([segment])
    return segment


def build_segments(plan: BuildPlan, runner: TaskRunner) -> list[Any]:
    """Run the plan's tasks through `runner`; the segments in task order. A failed task raises (nothing is
    committed; what the other tasks wrote is unreferenced)."""
    segments = runner(build_segment, plan.tasks)
    fault_point("index_build.after_tasks")
    return segments


def commit_segments(table: MemWalTable, read_version: int, segments: Sequence[Any]) -> lance.LanceDataset:
    """Commit the segments as one CreateIndex at `read_version` (call under the MemWAL index lock): they join
    their indexes as new segments. Lance refuses it (OSError) when a concurrent commit rewrote a covered
    fragment."""
    op = lance.LanceOperation.CreateIndex(new_indices=list(segments), removed_indices=[])
    ds = lance.LanceDataset.commit(table.uri, op, read_version=read_version,
                                   storage_options=lance_storage_options(table.storage_options))
    fault_point("index_build.after_commit")
    return ds
