"""Our bloom_filter.bin is Lance core's, byte for byte, and answers membership the way it does."""

from __future__ import annotations

import uuid
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from memwal.bloom_filter import NUM_BLOCKS, BloomFilter, read_bloom_filter, trusted_key_type
from memwal.errors import CorruptFileError
from memwal.naming import BLOOM_FILTER_FILE, MEM_WAL_DIR
from memwal.storage import ObjectStore

PK = {"lance-schema:unenforced-primary-key": "true"}


def _lance_core_generations(uri: str, key_type: pa.DataType, batches: list[list], deletes: list) -> list[Path]:
    """Write the batches (and deletes) with Lance core's ShardWriter, one generation per batch."""
    schema = pa.schema([pa.field("id", key_type, nullable=False, metadata=PK), pa.field("v", pa.int32())])
    lance.write_dataset(pa.table({"id": pa.array([], key_type), "v": pa.array([], pa.int32())}, schema=schema), uri)
    ds = lance.dataset(uri)
    ds.initialize_mem_wal(unsharded=True)
    with lance.dataset(uri).mem_wal_writer(str(uuid.uuid4()), max_memtable_rows=len(batches[0])) as w:
        for keys in batches:
            w.put(pa.table({"id": pa.array(keys, key_type), "v": pa.array(range(len(keys)), pa.int32())},
                           schema=schema))
        w.delete(pa.table({"id": pa.array(deletes, key_type)}))
    gens = sorted(p.parent for p in Path(uri, MEM_WAL_DIR).glob(f"*/*_gen_*/{BLOOM_FILTER_FILE}"))
    assert gens, "Lance core wrote no bloom_filter.bin: the scenario no longer exercises its format"
    return gens


@pytest.mark.parametrize(
    "key_type, batches, deletes",
    [
        (pa.int64(), [list(range(0, 3000, 3)), [*range(1, 5000, 7), 2**40, -5]], [3, 7]),
        (pa.int32(), [list(range(-500, 500)), [2**31 - 1, -(2**31), *range(10_000, 10_998)]], [0]),
        (pa.string(), [[f"user-{i}" for i in range(800)], ["", "é", "a" * 300, *(f"k{i}" for i in range(797))]],
         ["user-1"]),
        (pa.binary(), [[f"user-{i}".encode() for i in range(800)],
                       [b"", b"\x00\xff", b"a" * 300, *(f"k{i}".encode() for i in range(797))]], [b"user-1"]),
        (pa.large_string(), [[f"user-{i}" for i in range(800)], ["", *(f"k{i}" for i in range(799))]], ["user-1"]),
        (pa.large_binary(), [[f"user-{i}".encode() for i in range(800)],
                             [b"", *(f"k{i}".encode() for i in range(799))]], [b"user-1"]),
    ],
    ids=["int64", "int32", "utf8", "binary", "large_utf8", "large_binary"],
)
def test_our_bytes_equal_lance_core_bloom_filter_for_the_same_keys(tmp_path, key_type, batches, deletes):
    """Every generation Lance core's ShardWriter flushed: our filter over its keys (tombstones included)."""
    for gen in _lance_core_generations(str(tmp_path / "t"), key_type, batches, deletes):
        keys = lance.dataset(str(gen)).to_table(columns=["id"]).column("id")
        theirs = (gen / BLOOM_FILTER_FILE).read_bytes()
        ours = BloomFilter.from_keys(keys).to_bytes()
        assert len(ours) == len(theirs) == NUM_BLOCKS * 32
        assert ours == theirs, f"{gen.name}: our bloom filter bytes differ from Lance core's for the same keys"
        parsed = BloomFilter.from_bytes(theirs)
        assert parsed.might_contain(keys).all(), "a key Lance core inserted must test as maybe-present"


def test_absent_keys_are_mostly_rejected_and_present_keys_never():
    present = pa.array(np.arange(0, 8000, dtype=np.int64) * 2)
    absent = pa.array(np.arange(0, 8000, dtype=np.int64) * 2 + 1)
    bf = BloomFilter.from_bytes(BloomFilter.from_keys(present).to_bytes())
    assert bf.might_contain(present).all()
    assert bf.might_contain(absent).sum() < 80, "false positive rate far above the SBBF's design"
    chunked = pa.chunked_array([present.slice(0, 10), present.slice(10, 5)])
    assert bf.might_contain(chunked).tolist() == [True] * 15


def test_string_keys_hash_with_their_terminator():
    """Without the 0xFF terminator "ab" and "a"+"b" style prefixes would collide with Lance core's layout."""
    bf = BloomFilter.from_keys(pa.array([f"key{i}" for i in range(1000)]))
    assert bf.might_contain(pa.array([f"key{i}" for i in range(1000)])).all()
    assert bf.might_contain(pa.array([f"nokey{i}" for i in range(1000)])).sum() < 10


@pytest.mark.parametrize("values", [
    pa.array([1.5, 2.5]),
    pa.array(["a", "b"], pa.large_string()),
    pa.array([b"a", b"b"], pa.large_binary()),
    pa.StructArray.from_arrays([pa.array([1, 2]), pa.array(["x", "y"])], names=["a", "b"]),
])
def test_key_types_lance_core_does_not_hash_always_answer_maybe(values):
    bf = BloomFilter.from_keys(values)
    assert bf.might_contain(values).all()
    assert bf.might_contain(pa.array([9.0], pa.float64())).all(), "every such key collides, as in Lance core"


def test_only_key_types_compared_with_lance_core_are_trusted():
    """The types the byte-equality test above covers with a real hash; a colliding type's filter says nothing
    (and ours once hashed LargeUtf8 as Utf8), an untested one is not believed."""
    assert [t for t in (pa.int32(), pa.int64(), pa.string(), pa.binary()) if trusted_key_type(t)] == \
        [pa.int32(), pa.int64(), pa.string(), pa.binary()]
    for t in (pa.large_string(), pa.large_binary(), pa.float64(), pa.uint64(), pa.int16(), pa.binary(16)):
        assert not trusted_key_type(t), t


def test_read_bloom_filter_returns_none_without_file_and_names_a_corrupt_one(tmp_path):
    store = ObjectStore(str(tmp_path))
    assert read_bloom_filter(store, "r1", "abcd0123_gen_1") is None
    path = f"{MEM_WAL_DIR}/r1/abcd0123_gen_1/{BLOOM_FILTER_FILE}"
    store.put(path, b"\x00" * 31)
    with pytest.raises(CorruptFileError, match=r"abcd0123_gen_1/bloom_filter\.bin"):
        read_bloom_filter(store, "r1", "abcd0123_gen_1")
    store.put(path, BloomFilter.from_keys(pa.array([7], pa.int64())).to_bytes())
    assert read_bloom_filter(store, "r1", "abcd0123_gen_1").might_contain(pa.array([7])).tolist() == [True]


@pytest.mark.parametrize("types", [(pa.int64(), pa.string()), (pa.int32(), pa.binary()), (pa.string(), pa.int32())],
                         ids=["int64+utf8", "int32+binary", "utf8+int32"])
def test_a_composite_keys_filter_is_lance_cores_byte_for_byte(tmp_path, types):
    """Lance core hashes a composite key column by column into one hasher; ours gives the same bytes for the same
    keys (so a reader may believe its "absent", as trusted_key_type says for these column types)."""
    def key(position):
        return {**PK, "lance-schema:unenforced-primary-key:position": str(position)}

    schema = pa.schema([pa.field("a", types[0], nullable=False, metadata=key(1)),
                        pa.field("b", types[1], nullable=False, metadata=key(2)), pa.field("v", pa.int32())])

    def value(t, i):
        return i - 300 if pa.types.is_integer(t) else (f"k{i}".encode() if pa.types.is_binary(t) else f"k{i}\x00")

    n = 600
    rows = pa.table({"a": pa.array([value(types[0], i) for i in range(n)], types[0]),
                     "b": pa.array([value(types[1], i % 7) for i in range(n)], types[1]),
                     "v": pa.array(range(n), pa.int32())}, schema=schema)
    uri = str(tmp_path / "t")
    lance.write_dataset(rows.slice(0, 0), uri)
    lance.dataset(uri).initialize_mem_wal(unsharded=True)
    with lance.dataset(uri).mem_wal_writer(str(uuid.uuid4())) as w:
        w.put(rows)
    [gen] = [p.parent for p in Path(uri, MEM_WAL_DIR).glob(f"*/*_gen_*/{BLOOM_FILTER_FILE}")]
    theirs = (gen / BLOOM_FILTER_FILE).read_bytes()
    assert BloomFilter.from_keys(rows.column("a"), rows.column("b")).to_bytes() == theirs, \
        "our composite-key bloom filter bytes differ from Lance core's"
    assert trusted_key_type(*types)
