"""Murmur3 exactly as Lance core's MemWAL sharding computes it (rust/lance/src/dataset/mem_wal/sharding.rs),
vectorised over Arrow arrays: the bucket transform's hash, bit for bit."""

from __future__ import annotations

import struct

import mmh3
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["murmur3"]

_U32 = 0xFFFFFFFF

_C1, _C2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)
_F1, _F2 = np.uint32(0x85EBCA6B), np.uint32(0xC2B2AE35)
_M5, _N1 = np.uint32(5), np.uint32(0xE6546B64)
_S = {n: np.uint32(n) for n in (8, 13, 15, 16, 17, 19, 24)}
_LONG_STRING = 1024  # longer strings are hashed one by one with mmh3 (keeps the block loop short)


def _mix_k1(k: np.ndarray) -> np.ndarray:
    k = k * _C1
    k = (k << _S[15]) | (k >> _S[17])
    return k * _C2


def _mix_h1(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    h = h ^ k
    h = (h << _S[13]) | (h >> _S[19])
    return h * _M5 + _N1


def _fmix(h: np.ndarray, length: np.ndarray | np.uint32) -> np.ndarray:
    h = h ^ length
    h ^= h >> _S[16]
    h *= _F1
    h ^= h >> _S[13]
    h *= _F2
    h ^= h >> _S[16]
    return h


_F1_INV, _F2_INV = pow(0x85EBCA6B, -1, 2**32), pow(0xC2B2AE35, -1, 2**32)


def _fmix_scalar(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _U32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _U32
    return h ^ (h >> 16)


def _unfmix_scalar(h: int) -> int:
    h ^= h >> 16
    h = (h * _F2_INV) & _U32
    h ^= (h >> 13) ^ (h >> 26)
    h = (h * _F1_INV) & _U32
    return h ^ (h >> 16)


def _hash_bytes_scalar(b: bytes, seed: int) -> int:
    """Lance's byte hash via mmh3: standard murmur3 on the 4-byte blocks, then each tail byte mixed as a
    sign-extended 32-bit block (Spark's hashUnsafeBytes), finalised with the true length."""
    full = len(b) & ~3
    expanded = b[:full] + b"".join(struct.pack("<i", x - 256 if x > 127 else x) for x in b[full:])
    h1 = _unfmix_scalar(mmh3.hash(expanded, seed, signed=False)) ^ len(expanded)
    return _fmix_scalar(h1 ^ len(b))


def _hash_u32(v: np.ndarray, seed: np.ndarray) -> np.ndarray:
    return _fmix(_mix_h1(seed, _mix_k1(v)), np.uint32(4))


def _hash_u64(v: np.ndarray, seed: np.ndarray) -> np.ndarray:
    low = (v & np.uint64(_U32)).astype(np.uint32)
    high = (v >> np.uint64(32)).astype(np.uint32)
    return _fmix(_mix_h1(_mix_h1(seed, _mix_k1(low)), _mix_k1(high)), np.uint32(8))


def _hash_binary(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    if not pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.large_string())
    n = len(arr)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64)[arr.offset : arr.offset + n + 1]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1]
    lens = offsets[1:] - starts
    h = seed.copy()
    long_rows = np.flatnonzero(lens > _LONG_STRING)
    if len(long_rows):
        raw = bytes(data)  # only when there are long strings
        for i in long_rows:
            s = int(starts[i])
            h[i] = _hash_bytes_scalar(raw[s : s + int(lens[i])], int(h[i]))
        lens_short = np.where(lens > _LONG_STRING, 0, lens)
    else:
        lens_short = lens
    nblocks = (lens_short >> 2).astype(np.uint16)
    order = np.argsort(nblocks, kind="stable")  # radix sort; rows with more blocks come last
    active = n - np.cumsum(np.bincount(nblocks, minlength=1))  # active[j] = rows with > j blocks
    for j in range(int(nblocks.max()) if n else 0):
        idx = order[n - active[j] :]
        p = starts[idx] + 4 * j
        k = (
            data[p].astype(np.uint32)
            | (data[p + 1].astype(np.uint32) << _S[8])
            | (data[p + 2].astype(np.uint32) << _S[16])
            | (data[p + 3].astype(np.uint32) << _S[24])
        )
        h[idx] = _mix_h1(h[idx], _mix_k1(k))
    tail_at = starts + (nblocks.astype(np.int64) << 2)
    rem = lens_short & 3
    for t in range(3):
        idx = np.flatnonzero(rem > t)
        if len(idx):
            k = data[tail_at[idx] + t].view(np.int8).astype(np.int32).view(np.uint32)
            h[idx] = _mix_h1(h[idx], _mix_k1(k))
    short = lens <= _LONG_STRING
    h[short] = _fmix(h[short], lens[short].astype(np.uint32))
    return h


def _fixed_values(arr: pa.Array, dtype: type[np.generic]) -> np.ndarray:
    """The value buffer of a fixed-width array as numpy (null slots hold arbitrary values)."""
    return np.frombuffer(arr.buffers()[1], dtype=dtype)[arr.offset : arr.offset + len(arr)]


def _check_hashable(t: pa.DataType) -> None:
    """Lance core's set of bucketable types (plus string_view, whose bytes are those of a utf8)."""
    if not (
        pa.types.is_boolean(t)
        or pa.types.is_integer(t)
        or pa.types.is_float32(t)
        or pa.types.is_float64(t)
        or pa.types.is_date32(t)
        or pa.types.is_time(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_string_view(t)
    ):
        raise TypeError(
            f"unsupported source type {t} (Lance core hashes bool, integers, float32/64, date32, "
            "time32/64, timestamps, utf8 / large_utf8)"
        )


def _hash_values(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    """uint32 hashes of the non-null values (null slots: unspecified)."""
    t = arr.type
    if pa.types.is_boolean(t):
        return _hash_u32(pc.cast(arr, pa.uint32()).fill_null(0).to_numpy(), seed)
    if (pa.types.is_integer(t) and t.bit_width <= 32) or pa.types.is_date32(t) or pa.types.is_time32(t):
        np_t = np.dtype(f"{'u' if pa.types.is_unsigned_integer(t) else 'i'}{t.bit_width // 8}")
        return _hash_u32(_fixed_values(arr, np_t).astype(np.int32).view(np.uint32), seed)
    if t in (pa.int64(), pa.uint64()) or pa.types.is_timestamp(t) or pa.types.is_time64(t):
        return _hash_u64(_fixed_values(arr, np.uint64), seed)
    if pa.types.is_float32(t) or pa.types.is_float64(t):
        ft, it, nan = (
            (np.float32, np.uint32, 0x7FC00000)
            if t.bit_width == 32
            else (np.float64, np.uint64, 0x7FF8000000000000)
        )
        v = _fixed_values(arr, ft)
        bits = np.where(v == 0, it(0), np.where(np.isnan(v), it(nan), v.view(it)))  # Lance canonicalises
        return _hash_u32(bits, seed) if t.bit_width == 32 else _hash_u64(bits, seed)
    return _hash_binary(arr, seed)


def hash_into(arr: pa.Array | None, seed: np.ndarray) -> np.ndarray:
    """Lance core's hash_array_value: each row's hash with its seed; a NULL row returns its seed.

    An absent column (None) or a column of Arrow type null is all NULL. Raises TypeError if unsupported.
    """
    if arr is None or pa.types.is_null(arr.type):
        return seed.copy()
    _check_hashable(arr.type)
    if arr.null_count == len(arr):
        return seed.copy()
    h = _hash_values(arr, seed)
    if arr.null_count:
        h = np.where(arr.is_valid().to_numpy(zero_copy_only=False), h, seed)
    return h


def murmur3(values: pa.Array | pa.ChunkedArray, seed: int = 0) -> np.ndarray:
    """Signed 32-bit murmur3 (x86_32) of each value, exactly as Lance core's MemWAL bucket transform.

    Bytes hashed: bool as int32 0/1; int8/16/32, uint8/16/32, date32, time32 as one 32-bit block (signed
    types sign-extended, unsigned zero-extended); int64, uint64, timestamp (any unit, tz ignored: the raw
    value), time64 as two 32-bit blocks (low, high); float32/float64 as their bits with -0.0 -> 0.0 and
    every NaN -> the canonical NaN; utf8/large_utf8 as the UTF-8 bytes, but each tail byte (len % 4) is
    mixed as a sign-extended 32-bit block (Spark's hashUnsafeBytes), so only strings whose length is a
    multiple of 4 hash as standard mmh3 does. A NULL returns the seed.
    """
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    return hash_into(arr, np.full(len(arr), seed & _U32, np.uint32)).view(np.int32)
