"""Test helper: a brute-force model of vector, full-text and filtered search, and the check that Lance's
searches on a base table equal it.

Every row's vector and text are functions of its `name` (`vector_of`, `text_of`), so the model needs only
id -> name (and score). Vectors have small integer components: squared L2 distances are exact integers in
float32, so distances compare exactly and an ordered result is certain once ties are broken by id.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping

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


def _hash(name: str) -> int:
    return zlib.crc32(name.encode())


def vector_of(name: str) -> np.ndarray:
    """The row's vector: integer components in [-8, 8), a function of its name."""
    return np.random.default_rng(_hash(name)).integers(-8, 8, DIM).astype("float32")


def text_of(name: str) -> str:
    """The row's text: the WORDS whose bit is set in the name's hash, then the name."""
    h = _hash(name)
    return " ".join([w for i, w in enumerate(WORDS) if h >> i & 1] + [name])


def vector_column(names: list[str]) -> pa.FixedSizeListArray:
    flat = np.stack([vector_of(n) for n in names]).ravel() if names else np.zeros(0, "float32")
    return pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), DIM)


def exact_order(names: Mapping[int, str], q: np.ndarray) -> list[tuple[float, int]]:
    """Every row as (squared L2 distance to q, id), nearest first, ties by id."""
    return sorted((float(((vector_of(n) - q) ** 2).sum()), k) for k, n in names.items())


def fts_ids(names: Mapping[int, str], word: str) -> list[int]:
    return sorted(k for k, n in names.items() if word in text_of(n).split())


def _pairs(table: pa.Table) -> list[tuple[float, int]]:
    return list(zip(table.column("_distance").to_pylist(), table.column("id").to_pylist(), strict=True))


def assert_top_k(got: list[tuple[float, int]], names: Mapping[int, str], q: np.ndarray, k: int, what: str) -> None:
    """got (distance, id) are k nearest rows, nearest first: the model's k smallest distances, each id at its
    own distance (whichever of rows tied at the k-th distance Lance returns)."""
    order = exact_order(names, q)
    dist = {i: d for d, i in order}
    assert [d for d, _ in got] == [d for d, _ in order[:k]], f"{what}: distances {got} vs {order[:k]}"
    assert len({i for _, i in got}) == len(got) and all(dist.get(i) == d for d, i in got), \
        f"{what}: rows at wrong distances {got}"


def check_lance_searches(ds: lance.LanceDataset, names: Mapping[int, str], scores: Mapping[int, float],
                         vector_index: str, fts_index: str, what: str = "") -> None:
    """Through Lance on ds: exact search (no index) equals the full ordered model; ANN with every partition
    probed and refinement over all rows returns the model's nearest; the FTS query of each word and two scalar
    filters return the model's rows. The ANN and FTS plans must use the indexes named."""
    n = len(names)
    for qi, q in enumerate(QUERIES):
        exact = ds.to_table(columns=["id"], nearest={"column": "vec", "q": q, "k": max(n, 1), "use_index": False})
        got = _pairs(exact)
        assert [d for d, _ in got] == sorted(d for d, _ in got), f"{what}: exact search out of order, query {qi}"
        assert sorted(got) == exact_order(names, q), f"{what}: exact search, query {qi}"
        ann = {"column": "vec", "q": q, "k": ANN_K, "nprobes": PARTITIONS,
               "refine_factor": math.ceil(max(n, 1) / ANN_K) + 1}
        plan = ds.scanner(columns=["id"], nearest=ann).explain_plan()
        if vector_index in {d.name for d in ds.describe_indices()}:
            assert f"ANNSubIndex: name={vector_index}" in plan, f"{what}: the ANN search does not use the index"
        assert_top_k(_pairs(ds.to_table(columns=["id"], nearest=ann)), names, q, min(ANN_K, n),
                     f"{what}: ANN search, query {qi}")
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

