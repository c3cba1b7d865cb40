"""Keys written more than once within one generation, as Lance core's flush leaves them: every put in the data
file in insert order, a deletion vector on the older rows, `_pk_index` and the bloom filter over every row.
Our flush writes the same files; Lance core reads ours, we read (scan, search, merge) Lance core's, and a
masked row never comes back."""

from __future__ import annotations

import glob
import uuid

import lance
import numpy as np
import pyarrow as pa
import pytest
from lance.file import LanceFileReader
from lance.mem_wal import LsmPointLookupPlanner, LsmScanner, LsmVectorSearchPlanner

from memwal.merge import merge_table
from memwal.reader import LsmReader
from memwal.writer import RegionWriter, WriterConfig

from support.tables import lance_core_snapshots

DIM = 4
PK = {"lance-schema:unenforced-primary-key": "true"}
SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False, metadata=PK),
    pa.field("text", pa.string()),
    pa.field("vec", pa.list_(pa.float32(), DIM)),
])
#: the vector of (id, version): versions far apart, so a stale version is nearest to a query at its offset
OFFSET = {"base": 0.0, "alpha": 10.0, "beta": 20.0, "gamma": 30.0, "delta": 40.0}
NEVER = WriterConfig(max_memtable_rows=10**9, max_flush_interval_s=None)


def vector(i: int, version: str) -> np.ndarray:
    return np.full(DIM, OFFSET[version] + i / 64, dtype=np.float32)  # exact in float32


def batch(ids, version: str) -> pa.Table:
    ids = list(ids)
    flat = np.concatenate([vector(i, version) for i in ids])
    return pa.table({"id": pa.array(ids, pa.int64()), "text": [f"{version} doc{i}" for i in ids],
                     "vec": pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), DIM)}, schema=SCHEMA)


#: one generation: 0-29 alpha; 10-19 again (beta); 15-17 a third time (gamma); 20-22 deleted; 21 put again
OPS = [("put", range(30), "alpha"), ("put", range(10, 20), "beta"), ("put", range(15, 18), "gamma"),
       ("delete", range(20, 23), None), ("put", [21], "delta")]


def model_after_ops(base_ids) -> dict[int, str]:
    model = {i: "base" for i in base_ids}
    for op, ids, version in OPS:
        for i in ids:
            if op == "put":
                model[i] = version
            else:
                model.pop(i, None)
    return model


def make_table(uri: str) -> None:
    """Base ids 100-399 with IVF_PQ 'vidx' and INVERTED 'fts' maintained, unsharded MemWAL."""
    ds = lance.write_dataset(batch(range(100, 400), "base"), uri)
    ds.create_index("vec", "IVF_PQ", name="vidx", num_partitions=2, num_sub_vectors=2)
    ds.create_scalar_index("text", "INVERTED", name="fts")
    lance.dataset(uri).initialize_mem_wal(unsharded=True, maintained_indexes=["vidx", "fts"])


def apply(writer, ops=OPS) -> None:
    for op, ids, version in ops:
        if op == "put":
            writer.put(batch(ids, version))
        else:
            writer.delete(pa.table({"id": pa.array(list(ids), pa.int64())}))


def write(uri: str, who: str) -> str:
    """The OPS as one generation, by our RegionWriter or Lance core's ShardWriter; returns its directory."""
    region = str(uuid.uuid4())
    if who == "ours":
        with RegionWriter(uri, region, config=NEVER) as w:
            apply(w)
    else:
        with lance.dataset(uri).mem_wal_writer(region, max_memtable_rows=10**6) as w:
            apply(w)
    [gen] = glob.glob(f"{uri}/_mem_wal/{region}/*_gen_1")
    return gen


def snapshots(uri: str):
    from types import SimpleNamespace

    return lance_core_snapshots(SimpleNamespace(kind="local", uri=uri, storage_options=None))


def physical(gen: str) -> list[dict]:
    """Every row of the generation's data file, deleted or not (read below Lance's dataset layer)."""
    [path] = glob.glob(f"{gen}/data/*.lance")
    return LanceFileReader(path).read_all().to_table().select(["id", "text", "_tombstone"]).to_pylist()


def pk_index(gen: str) -> list[tuple]:
    t = LanceFileReader(f"{gen}/_pk_index/page_data.lance").read_all().to_table()
    return sorted(zip(t.column("values").to_pylist(), t.column("ids").to_pylist(), strict=True))


def test_our_flush_leaves_duplicates_as_lance_core_does(tmp_path):
    """Same puts and deletes through both writers: the same physical rows in insert order, the same rows masked
    by a deletion vector, the same live rows at the same addresses, the same `_pk_index` and bloom filter."""
    gens = {}
    for who in ("ours", "lance_core"):
        uri = str(tmp_path / who)
        make_table(uri)
        gens[who] = write(uri, who)
    ours, theirs = gens["ours"], gens["lance_core"]
    assert physical(ours) == physical(theirs)
    assert len(physical(ours)) == sum(len(ids) for _, ids, _ in OPS), "every put and tombstone is written"
    live = {}
    for who, gen in gens.items():
        ds = lance.dataset(gen)
        [fragment] = ds.get_fragments()
        assert fragment.metadata.deletion_file is not None, f"{who}: no deletion vector"
        live[who] = ds.to_table(columns=["id", "text", "_tombstone"], with_row_address=True).to_pylist()
    assert live["ours"] == live["lance_core"]
    assert len(live["ours"]) == len(physical(ours)) - lance.dataset(ours).get_fragments()[0].metadata \
        .deletion_file.num_deleted_rows
    ids = [r["id"] for r in live["ours"]]
    assert len(ids) == len(set(ids)), "a key is live twice"
    assert pk_index(ours) == pk_index(theirs), "_pk_index must hold every row, as Lance core's does"
    with open(f"{ours}/bloom_filter.bin", "rb") as a, open(f"{theirs}/bloom_filter.bin", "rb") as b:
        assert a.read() == b.read()


def _check_lance_core_reads(uri: str, model: dict[int, str]) -> None:
    base = lance.dataset(uri)
    scanned = LsmScanner.from_snapshots(base, snapshots(uri)).to_table()
    assert {r["id"]: r["text"].split()[0] for r in scanned.to_pylist()} == model, "Lance core's scan"
    planner = LsmPointLookupPlanner(base, snapshots(uri), ["id"])
    for key in [*range(35), 100, 399]:
        got = planner.plan_lookup(pa.array([key], pa.int64())).to_table().to_pylist()
        assert [r["text"].split()[0] for r in got] == ([model[key]] if key in model else []), f"lookup of {key}"
    vectors = LsmVectorSearchPlanner(base, snapshots(uri), "vec")
    for version, i in (("alpha", 15), ("beta", 16), ("alpha", 21)):  # stale or deleted rows' own vectors
        got = vectors.plan_search(pa.array(vector(i, version)), k=10, overfetch_factor=20.0).to_table()
        rows = got.to_pylist()
        assert len(rows) == 10 and len({r["id"] for r in rows}) == 10, f"short or a key twice: {rows}"
        assert all(model.get(r["id"]) == r["text"].split()[0] for r in rows), f"a masked row came back: {rows}"


def test_lance_core_reads_our_generation_with_duplicates(tmp_path):
    uri = str(tmp_path / "t")
    make_table(uri)
    write(uri, "ours")
    _check_lance_core_reads(uri, model_after_ops(range(100, 400)))


def test_lance_core_reads_its_own_generation_the_same(tmp_path):
    """The control: the same checks pass on Lance core's own generation (so they test the files, not us)."""
    uri = str(tmp_path / "t")
    make_table(uri)
    write(uri, "lance_core")
    _check_lance_core_reads(uri, model_after_ops(range(100, 400)))


def _nearest(model: dict[int, str], q: np.ndarray, k: int) -> list[float]:
    return sorted(float(((vector(i, v) - q) ** 2).sum()) for i, v in model.items())[:k]


def _check_our_reads(uri: str, model: dict[int, str], what: str) -> None:
    reader = LsmReader(uri)
    assert {r["id"]: r["text"].split()[0] for r in reader.scan().to_pylist()} == model, f"{what}: scan"
    for i in (5, 15, 21, 30):
        want = model.get(i)
        got = reader.get(i)
        assert (got["text"].split()[0] if got else None) == want, f"{what}: get({i})"
    for version, i in (("alpha", 15), ("beta", 16), ("alpha", 21), ("gamma", 15)):
        q = vector(i, version)
        got = reader.search(q, k=12, nprobes=2, refine_factor=len(model), columns=["id", "text"])
        rows = got.to_pylist()
        assert all(model.get(r["id"]) == r["text"].split()[0] for r in rows), f"{what}: a masked row came back"
        assert got.column("_distance").to_pylist() == pytest.approx(_nearest(model, q, 12)), f"{what}: not exact"
    for word in ("alpha", "beta", "gamma", "delta"):
        got = reader.full_text_search(word, k=len(model), columns=["id", "text"]).to_pylist()
        assert sorted(r["id"] for r in got) == sorted(i for i, v in model.items() if v == word), \
            f"{what}: FTS {word!r} found a masked row or missed a live one"


@pytest.mark.parametrize("who", ["ours", "lance_core"])
def test_our_reader_search_and_merge_are_exact_over_duplicates(tmp_path, who):
    """Scan, point lookups, vector search (at stale vectors) and FTS (for stale words) over the generation,
    then after merging it: newest wins, no masked row comes back."""
    uri = str(tmp_path / "t")
    make_table(uri)
    write(uri, who)
    model = model_after_ops(range(100, 400))
    _check_our_reads(uri, model, f"{who} generation")
    assert not merge_table(uri).failed_regions
    assert {r["id"]: r["text"].split()[0] for r in lance.dataset(uri).to_table().to_pylist()} == model, \
        "the merged base table"
    _check_our_reads(uri, model, f"{who} generation merged")


def test_a_generation_whose_only_vectors_are_masked_never_returns_them(tmp_path):
    """Put then delete the same keys in one generation: the index built over every row holds their vectors,
    but neither our search nor Lance core's planner returns a masked row, and neither comes back short."""
    uri = str(tmp_path / "t")
    make_table(uri)
    region = str(uuid.uuid4())
    with RegionWriter(uri, region, config=NEVER) as w:
        apply(w, [("put", range(100, 103), "alpha"), ("delete", range(100, 103), None)])
    [gen] = glob.glob(f"{uri}/_mem_wal/{region}/*_gen_1")
    ds = lance.dataset(gen)
    assert ds.count_rows() == 3 and ds.get_fragments()[0].physical_rows == 6
    model = {i: "base" for i in range(103, 400)}
    assert LsmReader(uri).count_rows() == len(model)
    q = vector(101, "alpha")
    ours = LsmReader(uri).search(q, k=5, columns=["id"]).column("id").to_pylist()
    assert len(ours) == 5 and not set(ours) & {100, 101, 102}, ours
    theirs = LsmVectorSearchPlanner(lance.dataset(uri), snapshots(uri), "vec").plan_search(
        pa.array(q), k=5, overfetch_factor=20.0).to_table().column("id").to_pylist()
    assert len(theirs) == 5 and not set(theirs) & {100, 101, 102}, theirs


def test_masked_rows_across_several_data_files(tmp_path, monkeypatch):
    """A generation written as several fragments (3 rows per file here): each fragment's older rows are masked
    by its own deletion file, at offsets within that fragment."""
    from functools import partial

    from memwal import generation

    uri = str(tmp_path / "t")
    make_table(uri)
    monkeypatch.setattr(generation.lance, "write_dataset", partial(lance.write_dataset, max_rows_per_file=3))
    region = str(uuid.uuid4())
    ops = [("put", range(5), "alpha"), ("put", [1, 4], "beta"), ("put", [4], "gamma"), ("delete", [0], None)]
    with RegionWriter(uri, region, config=NEVER) as w:
        apply(w, ops)
    monkeypatch.undo()
    [gen] = glob.glob(f"{uri}/_mem_wal/{region}/*_gen_1")
    fragments = lance.dataset(gen).get_fragments()
    assert [f.physical_rows for f in fragments] == [3, 3, 3]
    assert [f.metadata.deletion_file.num_deleted_rows if f.metadata.deletion_file else 0 for f in fragments] \
        == [2, 1, 1], "masked: alpha-0 (deleted), alpha-1 | alpha-4 | beta-4 (superseded by gamma-4)"
    live = lance.dataset(gen).to_table(columns=["id", "text", "_tombstone"]).to_pylist()
    assert [(r["id"], r["text"] and r["text"].split()[0], r["_tombstone"]) for r in live] == [
        (2, "alpha", False), (3, "alpha", False), (1, "beta", False), (4, "gamma", False), (0, None, True)]
    model = {i: "base" for i in range(100, 400)} | {1: "beta", 2: "alpha", 3: "alpha", 4: "gamma"}
    assert {r["id"]: r["text"].split()[0] for r in LsmReader(uri).scan().to_pylist()} == model
