"""Test helper: a brute-force model of vector, full-text and filtered search, and the check that Lance's
searches on a base table equal it.

Every row's vector and text are functions of its `name` (`vector_of`, `text_of`; `nullable_vector_of` makes
some of them null), so the model needs only id -> name (and score). Vectors have small integer components:
squared L2 and dot distances are exact integers in float32, so they compare exactly and an ordered result is
certain once ties are broken by id; cosine distances compare within COSINE_TOLERANCE.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping

import lance
import numpy as np
import pyarrow as pa

DIM = 8
PARTITIONS = 2  # IVF partitions: ANN searches probe every one
# IVF_PQ on tiny tables: 4-bit codes train on 16 rows (8-bit codes need 256, or Lance writes an empty index).
IVF_PQ_PARAMS = {"num_partitions": PARTITIONS, "num_sub_vectors": 2, "num_bits": 4}
WORDS = ("apple", "river", "stone", "cloud")
QUERIES = (np.zeros(DIM, "float32"), np.array([3, -2, 5, 0, -7, 1, 4, -4], "float32"))
ANN_K = 5
METRICS = ("l2", "cosine", "dot")
# float32 (Lance) against float64 (the model) cosine distances of vectors with components below 8
COSINE_TOLERANCE = 1e-5
Vector = Callable[[str], "np.ndarray | None"]


def _hash(name: str) -> int:
    return zlib.crc32(name.encode())


def vector_of(name: str) -> np.ndarray:
    """The row's vector: integer components in [-8, 8), a function of its name."""
    return np.random.default_rng(_hash(name)).integers(-8, 8, DIM).astype("float32")


def nullable_vector_of(name: str) -> np.ndarray | None:
    """vector_of(name), or None (a null vector) for about one in four written names: base names ('base.' or
    'b', as the search tests and the model machine name base rows) always have one (the index trains on them)."""
    if name.startswith("b") or _hash(name) % 4:
        return vector_of(name)
    return None


def distance(v: np.ndarray | None, q: np.ndarray, metric: str = "l2") -> float | None:
    """Lance's distance of v to q (squared L2 in float32, as Lance computes it: exact for these integer
    vectors; 1 - cosine similarity; 1 - dot product), None when undefined: a null vector, or a zero vector
    under cosine (Lance never returns such a row)."""
    if v is None:
        return None
    if metric == "l2":
        return float(((v - q) ** 2).sum())
    v64, q64 = v.astype(np.float64), q.astype(np.float64)
    if metric == "dot":
        return float(1.0 - v64 @ q64)
    norms = float(np.linalg.norm(v64) * np.linalg.norm(q64))
    return None if norms == 0 else float(1.0 - (v64 @ q64) / norms)


def text_of(name: str) -> str:
    """The row's text: the WORDS whose bit is set in the name's hash, then the name."""
    h = _hash(name)
    return " ".join([w for i, w in enumerate(WORDS) if h >> i & 1] + [name])


def vector_column(names: list[str], vector: Vector = vector_of) -> pa.FixedSizeListArray:
    """The vectors of `names` (`vector`: vector_of, or nullable_vector_of for null entries)."""
    vecs = [vector(n) for n in names]
    if vector is vector_of:
        flat = np.stack(vecs).ravel() if names else np.zeros(0, "float32")
        return pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), DIM)
    return pa.array([None if v is None else v.tolist() for v in vecs], pa.list_(pa.float32(), DIM))


def exact_order(names: Mapping[int, str], q: np.ndarray, metric: str = "l2", vector: Vector = vector_of
                ) -> list[tuple[float, int]]:
    """Every row with a defined distance as (distance to q, id), nearest first, ties by id: rows with a null
    vector (or a zero one under cosine) are never results."""
    found = ((distance(vector(n), q, metric), k) for k, n in names.items())
    return sorted((d, k) for d, k in found if d is not None)


def fts_ids(names: Mapping[int, str], word: str) -> list[int]:
    return sorted(k for k, n in names.items() if word in text_of(n).split())


def _pairs(table: pa.Table) -> list[tuple[float, int]]:
    return list(zip(table.column("_distance").to_pylist(), table.column("id").to_pylist(), strict=True))


def assert_top_k(got: list[tuple[float, int]], names: Mapping[int, str], q: np.ndarray, k: int, what: str,
                 metric: str = "l2", vector: Vector = vector_of) -> None:
    """got (distance, id) are k nearest rows, nearest first: the model's k smallest distances, each id at its
    own distance (whichever of rows tied at the k-th distance Lance returns); fewer only when fewer rows have
    a defined distance. Cosine distances compare within COSINE_TOLERANCE, the others exactly."""
    order = exact_order(names, q, metric, vector)
    dist = {i: d for d, i in order}
    tol = COSINE_TOLERANCE if metric == "cosine" else 0.0
    want = [d for d, _ in order[:k]]
    assert len(got) == len(want) and all(abs(g - w) <= tol for (g, _), w in zip(got, want, strict=False)), \
        f"{what}: distances {got} vs {order[:k]}"
    assert len({i for _, i in got}) == len(got) and all(i in dist and abs(dist[i] - d) <= tol for d, i in got), \
        f"{what}: rows at wrong distances (or without a vector) {got}"


def check_lance_searches(ds: lance.LanceDataset, names: Mapping[int, str], scores: Mapping[int, float],
                         vector_index: str, fts_index: str, what: str = "", metric: str = "l2",
                         vector: Vector = vector_of) -> None:
    """Through Lance on ds: exact search (no index) equals the full ordered model; ANN with every partition
    probed and refinement over all rows returns the model's nearest; the FTS query of each word and two scalar
    filters return the model's rows. The ANN and FTS plans must use the indexes named. `metric` is the vector
    index's; rows whose distance is undefined (`vector` gives a null one) are never results."""
    n = len(names)
    for qi, q in enumerate(QUERIES):
        exact = ds.to_table(columns=["id"], nearest={"column": "vec", "q": q, "k": max(n, 1), "use_index": False,
                                                     "metric": metric})
        got = _pairs(exact)
        assert [d for d, _ in got] == sorted(d for d, _ in got), f"{what}: exact search out of order, query {qi}"
        assert_top_k(got, names, q, n, f"{what}: exact search, query {qi}", metric, vector)
        ann = {"column": "vec", "q": q, "k": ANN_K, "nprobes": PARTITIONS,
               "refine_factor": math.ceil(max(n, 1) / ANN_K) + 1}
        plan = ds.scanner(columns=["id"], nearest=ann).explain_plan()
        if vector_index in {d.name for d in ds.describe_indices()}:
            assert f"ANNSubIndex: name={vector_index}" in plan, f"{what}: the ANN search does not use the index"
        assert_top_k(_pairs(ds.to_table(columns=["id"], nearest=ann)), names, q, ANN_K,
                     f"{what}: ANN search, query {qi}", metric, vector)
    for word in WORDS:
        fts = {"query": word, "columns": ["text"]}
        if fts_index in {d.name for d in ds.describe_indices()}:
            assert "MatchQuery: column=text" in ds.scanner(columns=["id"], full_text_query=fts).explain_plan()
        got = sorted(ds.to_table(columns=["id"], full_text_query=fts).column("id").to_pylist())
        assert got == fts_ids(names, word), f"{what}: FTS {word!r}"
    some = min(names.values(), default="")
    for where, want in ((f"name = '{some}'", [k for k, v in names.items() if v == some]),
                        ("score >= 0", [k for k, s in scores.items() if s >= 0])):
        got = sorted(ds.to_table(columns=["id"], filter=where).column("id").to_pylist())
        assert got == sorted(want), f"{what}: filter {where}"


NAMED_SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False, metadata={"lance-schema:unenforced-primary-key": "true"}),
    pa.field("name", pa.string()),
    pa.field("vec", pa.list_(pa.float32(), DIM)),
])


def named_rows(names: Mapping[int, str]) -> pa.Table:
    """Rows id, name, vec (vector_of(name)), ids ascending: the search tests' table shape."""
    ids = sorted(names)
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [names[i] for i in ids],
                     "vec": vector_column([names[i] for i in ids])}, schema=NAMED_SCHEMA)


def create_indexed_base(loc, names: Mapping[int, str]) -> None:
    """A base table of named_rows(names) with an IVF_PQ `vec_idx`, MemWAL initialized maintaining it."""
    from memwal.storage import lance_storage_options

    opts = lance_storage_options(loc.storage_options)
    ds = lance.write_dataset(named_rows(names), loc.uri, storage_options=opts)
    ds.create_index("vec", "IVF_PQ", name="vec_idx", **IVF_PQ_PARAMS)
    lance.dataset(loc.uri, storage_options=opts).initialize_mem_wal(maintained_indexes=["vec_idx"], unsharded=True)

