"""Test helper: a MemWAL table with one index of each type catch-up builds per fragment group (IVF_PQ,
INVERTED, BTREE, BITMAP, LABEL_LIST), rows appended outside the index, and a brute-force check of the
searches each index serves."""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa

from memwal.storage import lance_storage_options

from support.tables import PK

DIM = 16
WORDS = ["apple", "river", "stone", "cloud", "ember", "maple", "quartz", "violet"]
SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False, metadata=PK),
    pa.field("text", pa.string()),
    pa.field("cat", pa.string()),
    pa.field("tags", pa.list_(pa.string())),
    pa.field("vec", pa.list_(pa.float32(), DIM)),
])
# index name -> (column, type, create_index keyword arguments)
INDEXES = {
    "vec_idx": ("vec", "IVF_PQ", {"num_partitions": 4, "num_sub_vectors": 4}),
    "text_idx": ("text", "INVERTED", {}),
    "id_idx": ("id", "BTREE", {}),
    "cat_idx": ("cat", "BITMAP", {}),
    "tags_idx": ("tags", "LABEL_LIST", {}),
}


def vectors(ids) -> np.ndarray:
    return np.stack([np.random.default_rng(i * 7919).standard_normal(DIM).astype("float32") for i in ids])


def text_of(i: int) -> str:
    return f"{WORDS[i % 8]} {WORDS[(i // 8) % 8]} doc{i}"


def rows(lo: int, hi: int) -> pa.Table:
    ids = list(range(lo, hi))
    flat = pa.array(vectors(ids).ravel(), pa.float32())
    return pa.table({"id": pa.array(ids, pa.int64()), "text": [text_of(i) for i in ids],
                     "cat": [WORDS[i % 5] for i in ids], "tags": [[WORDS[i % 3], WORDS[i % 7]] for i in ids],
                     "vec": pa.FixedSizeListArray.from_arrays(flat, DIM)}, schema=SCHEMA)


def create_index_table(loc, base: int = 2000, indexes: dict | None = None) -> None:
    """`base` rows in two fragments, the indexes built over them, MemWAL initialised maintaining them."""
    opts = lance_storage_options(loc.storage_options)
    ds = lance.write_dataset(rows(0, base), loc.uri, storage_options=opts, max_rows_per_file=base // 2)
    for name, (column, kind, kwargs) in (indexes or INDEXES).items():
        if kind.startswith("IVF"):
            ds.create_index(column, kind, name=name, **kwargs)
        else:
            ds.create_scalar_index(column, kind, name=name, **kwargs)
    lance.dataset(loc.uri, storage_options=opts).initialize_mem_wal(unsharded=True)


def append(loc, lo: int, hi: int, per_fragment: int = 500) -> None:
    """Rows lo..hi appended as fragments of `per_fragment` rows that no index covers."""
    lance.write_dataset(rows(lo, hi), loc.uri, mode="append", max_rows_per_file=per_fragment,
                        storage_options=lance_storage_options(loc.storage_options))


def search_results(ds: lance.LanceDataset, names=tuple(INDEXES)) -> dict:
    """What each index answers (ANN with every partition probed and refined, FTS, filters), checked against
    brute force over the table's ids; returned so two builds can be compared."""
    ids = sorted(ds.to_table(columns=["id"])["id"].to_pylist())
    out: dict = {}
    if "vec_idx" in names:
        matrix = vectors(ids)
        stats = ds.stats.index_stats("vec_idx")
        partitions = max(s["num_partitions"] for s in stats["segments"])
        for seed in range(3):
            q = np.random.default_rng(1000 + seed).standard_normal(DIM).astype("float32")
            expected = np.array(ids)[np.argsort(((matrix - q) ** 2).sum(axis=1), kind="stable")[:10]].tolist()
            ann = ds.to_table(columns=["id"], nearest={"column": "vec", "q": q, "k": 10, "nprobes": partitions,
                                                       "refine_factor": len(ids)})["id"].to_pylist()
            assert ann == expected, (seed, ann, expected)
            out[f"ann{seed}"] = ann
    if "text_idx" in names:
        for word in ("quartz", f"doc{ids[-1]}", f"doc{ids[0]}"):
            hits = sorted(ds.to_table(columns=["id"], full_text_query=word)["id"].to_pylist())
            assert hits == [i for i in ids if word in text_of(i).split()], word
            out[f"fts:{word}"] = hits
    if "id_idx" in names:
        lo, hi = ids[len(ids) // 3], ids[-1] - 7
        got = sorted(ds.to_table(columns=["id"], filter=f"id >= {lo} AND id < {hi}")["id"].to_pylist())
        assert got == [i for i in ids if lo <= i < hi]
        out["btree"] = got
    if "cat_idx" in names:
        got = sorted(ds.to_table(columns=["id"], filter="cat = 'ember'")["id"].to_pylist())
        assert got == [i for i in ids if WORDS[i % 5] == "ember"]
        out["bitmap"] = got
    if "tags_idx" in names:
        got = sorted(ds.to_table(columns=["id"], filter="array_has_any(tags, ['maple'])")["id"].to_pylist())
        assert got == [i for i in ids if "maple" in (WORDS[i % 3], WORDS[i % 7])]
        out["label_list"] = got
    for name in names:
        assert ds.stats.index_stats(name)["num_unindexed_rows"] == 0, name
    return out
