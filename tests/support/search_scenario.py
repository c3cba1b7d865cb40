"""Test helper: a MemWAL table with a maintained vector index and a maintained full-text index, two regions of
updates, deletes and within-generation rewrites, and the check that vector search and full-text search over
a reader equal a brute-force newest-wins model (for GC and race tests of search)."""

from __future__ import annotations

import uuid

import lance
import pyarrow as pa

from memwal import naming
from memwal.reader import LsmReader
from memwal.storage import lance_storage_options
from memwal.writer import RegionWriter

from support.fts_model import assert_ranking, global_bm25
from support.maintenance import ONE_GEN_PER_FLUSH
from support.tables import PK
from support.vector_model import (
    ANN_K,
    DIM,
    IVF_PQ_PARAMS,
    PARTITIONS,
    QUERIES,
    WORDS,
    assert_top_k,
    text_of,
    vector_column,
    vector_of,
)

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False, metadata=PK),
    pa.field("name", pa.string()),
    pa.field("text", pa.string()),
    pa.field("vec", pa.list_(pa.float32(), DIM)),
])
INDEXES = ("vec_idx", "text_idx")
#: stale versions' vectors and names: a search near them must not find the stale rows
STALE = ("b0", "b31", "a1-12", "b1-45")


def table_of(names: dict[int, str]) -> pa.Table:
    ids = list(names)
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [names[i] for i in ids],
                     "text": [text_of(names[i]) for i in ids], "vec": vector_column([names[i] for i in ids])},
                    schema=SCHEMA)


def _generation(loc, region: str, batches: list[dict[int, str]], deletes=()) -> None:
    """One flushed generation: each batch put in turn (a key in two batches is written twice), then deletes."""
    with RegionWriter(loc.uri, region, storage_options=loc.storage_options, config=ONE_GEN_PER_FLUSH) as w:
        for b in batches:
            w.put(table_of(b))
        if deletes:
            w.delete(pa.table({"id": pa.array(list(deletes), pa.int64())}))
        w.flush()


def build(loc) -> tuple[list[str], dict[int, str]]:
    """| level               | rows                                                              |
    | base (IVF_PQ + FTS)  | ids 0-159 'b{i}'                                                  |
    | region A gen 1       | 0-19 updated, 160-179 new ('a1-')                                 |
    | region A gen 2       | 10-14 written twice ('a2x-' then 'a2-'), 15-29 updated; 30-34 deleted |
    | region B gen 1       | 40-59 updated, 180-189 new ('b1-'); 60-64 deleted                 |
    | region B gen 2       | 45-50 updated, 60 put again ('b2-')                               |
    Returns the region ids and the model (id -> name of the newest live version)."""
    opts = lance_storage_options(loc.storage_options)
    model = {i: f"b{i}" for i in range(160)}
    ds = lance.write_dataset(table_of(model), loc.uri, storage_options=opts)
    ds.create_index("vec", "IVF_PQ", name="vec_idx", **IVF_PQ_PARAMS)
    ds.create_scalar_index("text", "INVERTED", name="text_idx")
    lance.dataset(loc.uri, storage_options=opts).initialize_mem_wal(maintained_indexes=list(INDEXES), unsharded=True)
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    steps = [
        (a, [{i: f"a1-{i}" for i in [*range(20), *range(160, 180)]}], ()),
        (a, [{i: f"a2x-{i}" for i in range(10, 15)}, {i: f"a2-{i}" for i in range(10, 30)}], range(30, 35)),
        (b, [{i: f"b1-{i}" for i in [*range(40, 60), *range(180, 190)]}], range(60, 65)),
        (b, [{i: f"b2-{i}" for i in [*range(45, 51), 60]}], ()),
    ]
    for region, batches, deletes in steps:
        _generation(loc, region, batches, deletes)
        for batch in batches:
            model.update(batch)
        for i in deletes:
            del model[i]
    return [a, b], model


def generation_dirs(loc, region: str) -> list[str]:
    return sorted(d for d in loc.store().list_dirs(naming.region_dir(region)) if "_gen_" in d)


def check_searches(reader: LsmReader, model: dict[int, str], what: str) -> None:
    """Vector search (exact: every partition probed, refined over every row; and ANN at the defaults) and
    full-text search (every matching row) over `reader` equal the newest-wins model: every live row once, at
    its newest version, exact distances and global BM25 scores; no stale or deleted row."""
    n = len(model)
    for q in (*QUERIES, *(vector_of(s) for s in STALE)):
        got = reader.search(q, column="vec", k=n, nprobes=PARTITIONS, refine_factor=n, columns=["id", "name"])
        rows = got.to_pylist()
        assert all(model.get(r["id"]) == r["name"] for r in rows), f"{what}: a stale or deleted row came back"
        pairs = list(zip(got.column("_distance").to_pylist(), got.column("id").to_pylist(), strict=True))
        assert_top_k(pairs, model, q, n, f"{what}: exact vector search")
        ann = reader.search(q, column="vec", k=ANN_K, columns=["id", "name"]).to_pylist()
        assert len(ann) == ANN_K, f"{what}: ANN search came back short"
        assert all(model.get(r["id"]) == r["name"] for r in ann), f"{what}: ANN returned a stale row"
    texts = {i: text_of(name) for i, name in model.items()}
    for word in (*WORDS, *STALE):
        got = reader.full_text_search(word, column="text", k=n, columns=["id", "name"])
        rows = got.to_pylist()
        assert all(model.get(r["id"]) == r["name"] for r in rows), f"{what}: FTS {word!r} returned a stale row"
        assert_ranking([r["id"] for r in rows], got.column("_score").to_pylist(), global_bm25(texts, word), n,
                       f"{what}: FTS {word!r}")
