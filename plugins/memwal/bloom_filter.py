"""A generation's `bloom_filter.bin`: Lance core's split-block bloom filter over the primary keys, byte for byte.

Readers use it to skip a generation when asking "does a newer version of this key exist?": False is
certain, True means "maybe" (probe the generation's `_pk_index`). The layout is Parquet's SBBF with no
header: 1024 blocks of eight little-endian u32 (32768 bytes, Lance core's fixed size). A key's hash is
Rust's `DefaultHasher` (SipHash-1-3, keys 0, 0) over a 0x00 byte then the value: Int32/Int64 as
little-endian bytes, Utf8 as its bytes then 0xFF, Binary as its length (u64, little-endian) then its bytes.
Lance core defines no value hash for other key types (LargeUtf8, LargeBinary, ...): they hash the 0x00 byte
alone, so every key collides and every probe answers True. A composite key Lance core hashes column by column
into one hasher (each column's 0x00 and value bytes, one after the other); so do we.

A reader trusts a filter's "no" only for keys whose every column is of a type in TRUSTED_KEY_TYPES: those
whose filters we compared byte for byte with the ones Lance core's own writer flushed
(tests/library/test_bloom_filter.py, composite keys included). The others are never read (LargeUtf8's say
nothing, and ours hashed it as Utf8 before).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.types as pat
from siphash24 import siphash13

from memwal.errors import CorruptFileError
from memwal.naming import BLOOM_FILTER_FILE, generation_dir
from memwal.storage import ObjectStore

NUM_BLOCKS = 1024  # Lance core's size: 8192 distinct values at fpp 0.00057, whatever the row count
_WORDS = 8
_BLOCK_BYTES = _WORDS * 4
_SALT = np.array(
    [0x47B6137B, 0x44974D91, 0x8824AD5B, 0xA2B7289D, 0x705495C7, 0x2DF1424B, 0x9EFC4947, 0x5C6BFB31],
    dtype=np.uint64,
)
_SIP_KEY = bytes(16)
_PREFIX = b"\x00"
_STR_END = b"\xff"


def _sip(data: bytes) -> int:
    return int.from_bytes(siphash13(data, key=_SIP_KEY).digest(), "little")


_COLLIDING_HASH = _sip(_PREFIX)  # the hash of every value of a type Lance core does not hash


# Key types whose filters are Lance core's byte for byte (compared with its writer's files): only these are read.
TRUSTED_KEY_TYPES = (pa.int32(), pa.int64(), pa.string(), pa.binary())


def trusted_key_type(*types: pa.DataType) -> bool:
    """Whether a filter over keys of these column types (one, or a composite key's) may be believed when it says
    "absent"."""
    return all(any(t.equals(u) for u in TRUSTED_KEY_TYPES) for t in types)


def _combine(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks() if values.num_chunks else pa.array([], type=values.type)
    return values


def _value_bytes(arr: pa.Array) -> list[bytes]:
    """Per value, the bytes Lance core hashes after the 0x00 prefix (b"" for a null or a type it does not hash)."""
    t = arr.type
    if pat.is_int32(t) or pat.is_int64(t):
        width = 4 if pat.is_int32(t) else 8
        raw = np.asarray(arr.fill_null(0).to_numpy(zero_copy_only=False), dtype=f"<i{width}")
        out = [v.tobytes() for v in raw]
    elif pat.is_string(t):
        out = [b"" if v is None else v.encode() + _STR_END for v in arr.to_pylist()]
    elif pat.is_binary(t):  # Rust hashes a byte slice length-prefixed
        out = [b"" if v is None else len(v).to_bytes(8, "little") + v for v in arr.to_pylist()]
    else:
        return [b""] * len(arr)
    if arr.null_count:
        for i in np.flatnonzero(np.asarray(arr.is_null())):
            out[i] = b""
    return out


def key_hashes(*columns: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Lance core's 64-bit hash of each key (uint64), as its bloom filter inserts and probes them: one column,
    or a composite key's columns (hashed one after the other into one hasher, as Lance core does)."""
    encoded = [_value_bytes(_combine(c)) for c in columns]
    n = len(encoded[0])
    return np.fromiter((_sip(b"".join(_PREFIX + e[i] for e in encoded)) for i in range(n)), dtype=np.uint64, count=n)


def block_positions(hashes: np.ndarray, num_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Each hash's block index and its eight bit masks (one per word of the block)."""
    block = ((hashes >> np.uint64(32)) * np.uint64(num_blocks)) >> np.uint64(32)
    low = hashes & np.uint64(0xFFFFFFFF)
    bits = ((low[:, None] * _SALT[None, :]) & np.uint64(0xFFFFFFFF)) >> np.uint64(27)
    masks = (np.uint64(1) << bits).astype(np.uint32)
    return block.astype(np.int64), masks


class BloomFilter:
    """A split-block bloom filter over a generation's primary keys (Lance core's `bloom_filter.bin`)."""

    def __init__(self, words: np.ndarray):
        if words.ndim != 2 or words.shape[1] != _WORDS or words.shape[0] == 0:
            raise ValueError(f"a bloom filter is a non-empty (blocks, 8) array of u32, got shape {words.shape}")
        self._words = words.astype(np.uint32, copy=False)

    @classmethod
    def from_keys(cls, *columns: pa.Array | pa.ChunkedArray) -> BloomFilter:
        """The filter Lance core writes for these keys (tombstoned keys included, as Lance core does): one key
        column, or a composite key's columns."""
        words = np.zeros((NUM_BLOCKS, _WORDS), dtype=np.uint32)
        block, masks = block_positions(key_hashes(*columns), NUM_BLOCKS)
        for i in range(_WORDS):
            np.bitwise_or.at(words[:, i], block, masks[:, i])
        return cls(words)

    @classmethod
    def from_bytes(cls, data: bytes, path: str = BLOOM_FILTER_FILE) -> BloomFilter:
        """Parse `bloom_filter.bin` bytes; CorruptFileError naming `path` if they are not whole blocks."""
        if not data or len(data) % _BLOCK_BYTES:
            raise CorruptFileError(path, f"{len(data)} bytes is not a whole number of {_BLOCK_BYTES}-byte blocks")
        words = np.frombuffer(data, dtype="<u4").reshape(-1, _WORDS)
        return cls(words.astype(np.uint32))

    def to_bytes(self) -> bytes:
        """Lance core's exact bytes: the blocks in order, each word little-endian, no header."""
        return self._words.astype("<u4").tobytes()

    @property
    def num_blocks(self) -> int:
        return self._words.shape[0]

    def might_contain(self, values: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Per value: False if the generation certainly has no row with this key, True if it may."""
        return self.might_contain_hashes(key_hashes(values))

    def might_contain_hashes(self, hashes: np.ndarray) -> np.ndarray:
        """might_contain for keys already hashed with key_hashes (one hash, probed in many filters)."""
        block, masks = block_positions(hashes, self.num_blocks)
        return np.all((self._words[block] & masks) == masks, axis=1)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BloomFilter) and np.array_equal(self._words, other._words)

    __hash__ = None  # type: ignore[assignment]


def bloom_filter_path(region_id: str, generation_path: str) -> str:
    """Where a generation's bloom filter lives, relative to the table root."""
    return f"{generation_dir(region_id, generation_path)}/{BLOOM_FILTER_FILE}"


def read_bloom_filter(store: ObjectStore, region_id: str, generation_path: str) -> BloomFilter | None:
    """The generation's bloom filter, or None when it has none (generations flushed without one)."""
    path = bloom_filter_path(region_id, generation_path)
    try:
        data = store.get(path)
    except FileNotFoundError:
        return None
    return BloomFilter.from_bytes(data, path=path)


def write_bloom_filter(
    store: ObjectStore, region_id: str, generation_path: str, *keys: pa.Array | pa.ChunkedArray
) -> None:
    """Write the generation's bloom filter over the key column(s) (before its region manifest commit)."""
    store.put(bloom_filter_path(region_id, generation_path), BloomFilter.from_keys(*keys).to_bytes())
