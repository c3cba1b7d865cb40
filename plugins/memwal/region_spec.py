"""Region specs (memwal-spec.txt "Region Spec" .. "Region Pruning"): validate, evaluate, route, prune.
Bucket hashing reproduces Lance core (pylance 14 `lance.mem_wal.evaluate_sharding_spec`) bit for bit."""

from __future__ import annotations

import datetime
import itertools
import math
import re
import struct
import zoneinfo
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import mmh3
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal._proto import memwal_pb2
from memwal.errors import RegionSpecError
from memwal.naming import REGION_FIELD_PREFIX

__all__ = [
    "FIELD_ID_METADATA",
    "TRANSFORMS",
    "RegionField",
    "RegionSpec",
    "evaluate",
    "murmur3",
    "parse_simple_predicates",
    "prune",
    "route",
    "source_names_from_schema",
]

# Arrow field metadata key under which Lance core hands out field ids (WAL entries carry it).
FIELD_ID_METADATA = b"lance:field_id"

_DATE_PARTS = ("year", "month", "day", "hour")
# "unsharded" is not in the spec: Lance core writes it for initialize_mem_wal(unsharded=True); every row -> 0.
TRANSFORMS = frozenset({"identity", *_DATE_PARTS, "bucket", "multi_bucket", "truncate", "unsharded"})
_INT32_RESULT = frozenset({*_DATE_PARTS, "bucket", "multi_bucket", "unsharded"})
_NUM_BUCKETS = "num_buckets"
_WIDTH = "width"
# Lance core: a non-blank `column` parameter names the batch column directly, overriding source_ids.
_COLUMN = "column"
_I32_MAX = 2**31 - 1
_U32 = 0xFFFFFFFF


def _positive_int_param(field_id: str, transform: str, params: Mapping[str, str], name: str) -> int:
    """A parameter parsed as Lance core parses num_buckets (Rust `str::parse::<i32>`), required > 0."""
    if name not in params:
        raise RegionSpecError(f"region field {field_id!r}: transform {transform!r} needs parameter {name!r}")
    raw = params[name]
    if not re.fullmatch(r"[+-]?[0-9]+", raw or ""):
        raise RegionSpecError(
            f"region field {field_id!r}: parameter {name!r} of transform {transform!r} is not an integer: "
            f"{raw!r}"
        )
    value = int(raw)
    if value <= 0 or value > _I32_MAX:
        raise RegionSpecError(
            f"region field {field_id!r}: parameter {name!r} of transform {transform!r} must be a positive "
            f"32-bit integer, got {raw!r}"
        )
    return value


@dataclass(frozen=True)
class RegionField:
    """One region field: a transform (or a DataFusion SQL expression) over source fields, by field id."""

    field_id: str
    source_ids: tuple[int, ...]
    transform: str | None
    expression: str | None
    result_type: str
    parameters: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "source_ids", tuple(int(s) for s in self.source_ids))
        object.__setattr__(self, "parameters", {str(k): str(v) for k, v in dict(self.parameters).items()})
        self.validate()

    def __hash__(self) -> int:
        return hash(
            (
                self.field_id,
                self.source_ids,
                self.transform,
                self.expression,
                self.result_type,
                tuple(sorted(self.parameters.items())),
            )
        )

    def validate(self) -> None:
        """Raise RegionSpecError unless the field is well formed (evaluability is checked by evaluate)."""
        fid = self.field_id
        if not isinstance(fid, str) or not fid:
            raise RegionSpecError(f"region field has an empty or non-string field_id: {fid!r}")
        if (self.transform is None) == (self.expression is None):
            raise RegionSpecError(
                f"region field {fid!r}: exactly one of transform / expression must be set "
                f"(transform={self.transform!r}, expression={self.expression!r})"
            )
        if self.expression is not None:
            if not self.expression.strip():
                raise RegionSpecError(f"region field {fid!r}: empty expression")
            return
        if self.transform not in TRANSFORMS:
            raise RegionSpecError(
                f"region field {fid!r}: unknown transform {self.transform!r} (known: {sorted(TRANSFORMS)})"
            )
        if self.transform in ("bucket", "multi_bucket"):
            _positive_int_param(fid, self.transform, self.parameters, _NUM_BUCKETS)
        elif self.transform == "truncate":
            _positive_int_param(fid, self.transform, self.parameters, _WIDTH)
        if self.transform != "unsharded" and not self.source_ids and not self._column_param():
            raise RegionSpecError(f"region field {fid!r}: transform {self.transform!r} needs source_ids")

    def _column_param(self) -> str | None:
        col = self.parameters.get(_COLUMN, "")
        return col if col.strip() and self.transform not in ("multi_bucket", "unsharded") else None

    @property
    def num_buckets(self) -> int:
        return _positive_int_param(self.field_id, str(self.transform), self.parameters, _NUM_BUCKETS)

    @property
    def width(self) -> int:
        return _positive_int_param(self.field_id, str(self.transform), self.parameters, _WIDTH)

    @property
    def column_name(self) -> str:
        """Name of this field's column in evaluate's output: region_field_{field_id}."""
        return f"{REGION_FIELD_PREFIX}{self.field_id}"

    def to_proto(self) -> memwal_pb2.RegionField:
        msg = memwal_pb2.RegionField(
            field_id=self.field_id, source_ids=list(self.source_ids), result_type=self.result_type
        )
        if self.transform is not None:
            msg.transform = self.transform
        if self.expression is not None:
            msg.expression = self.expression
        msg.parameters.update(self.parameters)
        return msg

    @classmethod
    def from_proto(cls, msg: memwal_pb2.RegionField) -> RegionField:
        return cls(
            field_id=msg.field_id,
            source_ids=tuple(msg.source_ids),
            transform=msg.transform if msg.HasField("transform") else None,
            expression=msg.expression if msg.HasField("expression") else None,
            result_type=msg.result_type,
            parameters=dict(msg.parameters),
        )

    def to_lance_dict(self) -> dict[str, Any]:
        return {
            "field_id": self.field_id,
            "source_ids": list(self.source_ids),
            "transform": self.transform,
            "expression": self.expression,
            "result_type": self.result_type,
            "parameters": dict(self.parameters),
        }

    @classmethod
    def from_lance_dict(cls, d: Mapping[str, Any]) -> RegionField:
        return cls(
            field_id=d["field_id"],
            source_ids=tuple(d.get("source_ids") or ()),
            transform=d.get("transform"),
            expression=d.get("expression"),
            result_type=d.get("result_type") or "",
            parameters=dict(d.get("parameters") or {}),
        )


@dataclass(frozen=True)
class RegionSpec:
    """How rows map to regions: a spec id (>= 1; 0 means "manual region, no spec") and its fields."""

    spec_id: int
    fields: tuple[RegionField, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))
        self.validate()

    def validate(self) -> None:
        if not isinstance(self.spec_id, int) or not 1 <= self.spec_id <= _U32:
            raise RegionSpecError(f"region spec id must be an integer in [1, 2^32), got {self.spec_id!r}")
        seen: set[str] = set()
        for f in self.fields:
            if not isinstance(f, RegionField):
                raise RegionSpecError(f"region spec {self.spec_id}: {f!r} is not a RegionField")
            if f.field_id in seen:
                raise RegionSpecError(f"region spec {self.spec_id}: duplicate field_id {f.field_id!r}")
            seen.add(f.field_id)

    def to_proto(self) -> memwal_pb2.RegionSpec:
        return memwal_pb2.RegionSpec(spec_id=self.spec_id, fields=[f.to_proto() for f in self.fields])

    @classmethod
    def from_proto(cls, msg: memwal_pb2.RegionSpec) -> RegionSpec:
        return cls(spec_id=msg.spec_id, fields=tuple(RegionField.from_proto(f) for f in msg.fields))

    def to_lance_dict(self) -> dict[str, Any]:
        """The dict `lance.mem_wal.evaluate_sharding_spec` accepts (every key present, as it requires)."""
        return {"spec_id": self.spec_id, "fields": [f.to_lance_dict() for f in self.fields]}

    @classmethod
    def from_lance_dict(cls, d: Mapping[str, Any]) -> RegionSpec:
        """From one entry of `LanceDataset.mem_wal_index_details()["sharding_specs"]`."""
        fields = tuple(RegionField.from_lance_dict(f) for f in d["fields"])
        return cls(spec_id=int(d["spec_id"]), fields=fields)


# --------------------------------------------------------------------------------------------------------
# Source field ids -> column names
# --------------------------------------------------------------------------------------------------------


def _lance_children(f: pa.Field) -> list[pa.Field]:
    """The children Lance gives field ids to (measured on pylance 14, LanceSchema.from_pyarrow)."""
    t = f.type
    if pa.types.is_struct(t):
        return [t.field(i) for i in range(t.num_fields)]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [t.value_field]
    if pa.types.is_map(t):
        return [pa.field("entries", pa.struct([t.key_field, t.item_field]))]
    if pa.types.is_fixed_size_list(t) and pa.types.is_struct(t.value_type):
        return [t.value_field]  # a fixed_size_list of primitives is one leaf; of structs it has children
    return []


def source_names_from_schema(schema: pa.Schema) -> dict[int, str]:
    """Map Lance field id -> column name, as Lance core resolves source_ids (nested: dotted "parent.child").

    Field ids come from the `lance:field_id` field metadata when any field carries it (WAL entries do, on
    nested children too; `_tombstone` does not). Otherwise ids are assigned as Lance assigns them to a
    fresh table: depth-first pre-order over ALL fields, nested ones included (struct children, list
    items, map entries/key/value, children of fixed_size_list<struct>), so with a struct column the
    top-level position is NOT the field id (measured: schema (a, s{x}, b) gives a=0, s=1, s.x=2, b=3).
    """
    out: dict[int, str] = {}

    def walk_meta(f: pa.Field, prefix: str) -> bool:
        found = False
        name = prefix + f.name
        raw = (f.metadata or {}).get(FIELD_ID_METADATA)
        if raw is not None:
            try:
                out[int(raw)] = name
                found = True
            except ValueError:
                pass
        for c in _lance_children(f):
            found = walk_meta(c, name + ".") or found
        return found

    if any([walk_meta(f, "") for f in schema]):
        return out
    out.clear()
    counter = itertools.count()

    def walk(f: pa.Field, prefix: str) -> None:
        out[next(counter)] = prefix + f.name
        for c in _lance_children(f):
            walk(c, prefix + f.name + ".")

    for f in schema:
        walk(f, "")
    return out


def _column_names(fld: RegionField, source_names: Mapping[int, str]) -> list[str]:
    col = fld._column_param()
    if col is not None:
        return [col]
    names = []
    for sid in fld.source_ids:
        if sid not in source_names:
            raise RegionSpecError(
                f"region field {fld.field_id!r}: source field id {sid} is not in the schema "
                f"(known ids: {sorted(source_names)})"
            )
        names.append(source_names[sid])
    return names


def _resolve(table: pa.Table, name: str) -> pa.Array | None:
    """A column by name; a dotted name also reaches into struct columns. None when absent."""
    idx = table.schema.get_all_field_indices(name)
    if idx:
        return table.column(idx[0]).combine_chunks()
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:cut])
        idx = table.schema.get_all_field_indices(head)
        if not idx:
            continue
        arr: pa.Array = table.column(idx[0]).combine_chunks()
        for part in parts[cut:]:
            if not pa.types.is_struct(arr.type) or arr.type.get_field_index(part) < 0:
                return None
            arr = pc.struct_field(arr, [arr.type.get_field_index(part)])
        return arr
    return None


# --------------------------------------------------------------------------------------------------------
# Murmur3 exactly as Lance core's MemWAL sharding computes it (rust/lance/src/dataset/mem_wal/sharding.rs)
# --------------------------------------------------------------------------------------------------------

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


def _hash_into(arr: pa.Array | None, seed: np.ndarray) -> np.ndarray:
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
    return _hash_into(arr, np.full(len(arr), seed & _U32, np.uint32)).view(np.int32)


# --------------------------------------------------------------------------------------------------------
# Transforms
# --------------------------------------------------------------------------------------------------------


def _result_arrow_type(fld: RegionField) -> pa.DataType:
    if fld.transform in _INT32_RESULT:
        return pa.int32()
    try:
        return pa.type_for_alias(fld.result_type)
    except (ValueError, KeyError):
        return pa.null()


def _valid_mask(arr: pa.Array) -> np.ndarray | None:
    return None if arr.null_count == 0 else ~arr.is_valid().to_numpy(zero_copy_only=False)


_EPOCH = datetime.datetime(1970, 1, 1)
_SECONDS_MIN = -62135596800 + 86400  # 0001-01-02: within Python's datetime range
_CHRONO_TZ_END = 4102444800  # 2100-01-01 UTC
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def _utc_offsets(seconds: np.ndarray, zone: zoneinfo.ZoneInfo) -> np.ndarray:
    """UTC offset (seconds) at each instant, as DataFusion's chrono-tz sees it: the zone's rules up to
    2100-01-01 UTC, then frozen at the last offset (chrono-tz tables end in 2099; measured)."""

    def offset(s: int) -> int:
        s = min(max(s, _SECONDS_MIN), _CHRONO_TZ_END - 1)
        local = zone.fromutc((_EPOCH + datetime.timedelta(seconds=s)).replace(tzinfo=zone))
        return int(local.utcoffset().total_seconds())  # type: ignore[union-attr]

    quarters, inverse = np.unique(seconds // 900, return_inverse=True)  # offsets change rarely
    start = np.array([offset(int(q) * 900) for q in quarters], np.int64)
    end = np.array([offset(int(q) * 900 + 899) for q in quarters], np.int64)
    out = start[inverse]
    for i in np.flatnonzero((start != end)[inverse]):  # a transition inside the quarter hour
        out[i] = offset(int(seconds[i]))
    return out


def _local_time(arr: pa.Array) -> pa.Array:
    """A tz-aware timestamp array as naive local wall-clock time.

    pyarrow's own conversion stops applying DST after 2037 (its tz database reader ignores the rule
    that continues the table), while DataFusion applies it until 2100, so named zones go through
    zoneinfo. Fixed offsets ("+05:30") are exact in pyarrow.
    """
    t = arr.type
    try:
        zone = zoneinfo.ZoneInfo(t.tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return pc.local_timestamp(arr)
    raw = arr.view(pa.int64()).fill_null(0).to_numpy()
    per = _PER_SECOND[t.unit]
    local = raw + _utc_offsets(raw // per, zone) * per
    return pa.array(local, pa.timestamp(t.unit), mask=_valid_mask(arr))


def _date_part(fld: RegionField, arr: pa.Array) -> pa.Array:
    """DataFusion's date_part(part, col0) as int32; tz-aware timestamps use local time, as DataFusion."""
    part = str(fld.transform)
    t = arr.type
    if pa.types.is_date64(t):
        arr, t = arr.view(pa.timestamp("ms")), pa.timestamp("ms")
    if pa.types.is_timestamp(t) and t.tz:
        arr = _local_time(arr)
    if pa.types.is_date32(t) and part == "hour":
        return pa.array(np.zeros(len(arr), np.int32), mask=_valid_mask(arr))
    if not (pa.types.is_date32(t) or pa.types.is_timestamp(t)):
        raise RegionSpecError(
            f"region field {fld.field_id!r}: transform {part!r} needs a date or timestamp "
            f"source column, got {t}"
        )
    return getattr(pc, part)(arr).cast(pa.int32())


def _truncate(fld: RegionField, arr: pa.Array) -> pa.Array:
    """left(col0, W) for strings (W characters); col0 - (col0 % W) for numbers, % truncating toward zero
    (DataFusion / Rust semantics: truncate(-7, 5) = -5, not Iceberg's floor -10)."""
    w = fld.width
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pc.utf8_slice_codeunits(arr, 0, w)
    if pa.types.is_string_view(t):
        return pc.utf8_slice_codeunits(arr.cast(pa.large_string()), 0, w).cast(t)
    mask = _valid_mask(arr)
    if pa.types.is_integer(t):
        v = arr.fill_null(0).to_numpy()
        wide = np.uint64 if t == pa.uint64() else np.int64
        vw = v.astype(wide)
        out = vw - np.fmod(vw, wide(w))  # |out| <= |v|: always fits the source type
        return pa.array(out.astype(v.dtype), type=t, mask=mask)
    if pa.types.is_floating(t) and t.bit_width in (32, 64):
        v = arr.fill_null(0).to_numpy()
        with np.errstate(invalid="ignore"):
            out = v - np.fmod(v, v.dtype.type(w))
        return pa.array(out, type=t, mask=mask)
    raise RegionSpecError(
        f"region field {fld.field_id!r}: transform 'truncate' needs a string or numeric "
        f"source column, got {t}"
    )


def _apply(fld: RegionField, cols: list[pa.Array | None], n: int) -> pa.Array:
    """Evaluate one region field over resolved source columns (None: column absent, i.e. all NULL)."""
    if fld.expression is not None:
        raise RegionSpecError(
            f"region field {fld.field_id!r} uses expression {fld.expression!r}: DataFusion SQL region "
            "expressions cannot be evaluated by this library (only the well-known transforms can)"
        )
    t = fld.transform
    if t == "unsharded":
        return pa.array(np.zeros(n, np.int32))
    try:
        if t in ("bucket", "multi_bucket"):
            seed = np.zeros(n, np.uint32)
            hashed = cols if t == "multi_bucket" else cols[:1]  # Lance core: bucket hashes col0 only
            for c in hashed:
                seed = _hash_into(c, seed)
            out = ((seed & np.uint32(_I32_MAX)) % np.uint32(fld.num_buckets)).astype(np.int32)
            if t == "bucket":
                return pa.array(out)  # Lance core: NULL -> hash = seed 0 -> bucket 0 (spec says NULL)
            all_null = np.ones(n, bool)
            for c in hashed:
                if c is not None:
                    all_null &= ~c.is_valid().to_numpy(zero_copy_only=False)
            return pa.array(out, mask=all_null if all_null.any() else None)
    except TypeError as e:
        raise RegionSpecError(f"region field {fld.field_id!r}: transform {t!r}: {e}") from None
    col = cols[0]
    if col is None:
        return pa.nulls(n, _result_arrow_type(fld))
    if t == "identity":
        return col
    if t in _DATE_PARTS:
        return _date_part(fld, col)
    return _truncate(fld, col)


def _as_table(table_or_batch: pa.Table | pa.RecordBatch) -> pa.Table:
    if isinstance(table_or_batch, pa.RecordBatch):
        return pa.Table.from_batches([table_or_batch])
    return table_or_batch


def evaluate(
    spec: RegionSpec, table_or_batch: pa.Table | pa.RecordBatch, source_names: Mapping[int, str]
) -> pa.Table:
    """One column `region_field_{field_id}` per spec field, row-aligned with the input.

    `source_names` maps source field id -> column name (see source_names_from_schema). An id missing
    from it raises RegionSpecError; a named column missing from the batch is read as all NULL (spec:
    "column removal resistant"; Lance core raises instead). Differences from the spec text, following
    Lance core: bucket is (murmur3 & 0x7FFFFFFF) % N, not abs(murmur3) % N, and bucket(NULL) is 0, not NULL.
    """
    table = _as_table(table_or_batch)
    n = table.num_rows
    names, arrays = [], []
    for fld in spec.fields:
        if fld.expression is not None:
            _apply(fld, [], n)  # raises, naming the field
        cols = [_resolve(table, name) for name in _column_names(fld, source_names)]
        names.append(fld.column_name)
        arrays.append(_apply(fld, cols, n))
    return pa.table(arrays, names=names)


def route(
    spec: RegionSpec, batch: pa.Table | pa.RecordBatch, source_names: Mapping[int, str]
) -> dict[tuple, pa.Table]:
    """Group the rows of a batch by region value tuple (one value per spec field, in spec order).

    Every row lands in exactly one group and rows keep their relative order inside a group.
    """
    table = _as_table(batch)
    n = table.num_rows
    if n == 0:
        return {}
    regions = evaluate(spec, table, source_names)
    key = np.zeros(n, np.int64)
    dictionaries: list[tuple[pa.Array, np.ndarray]] = []
    for col in regions.columns:
        arr = col.combine_chunks()
        if pa.types.is_null(arr.type):
            dictionary, codes = pa.nulls(1), np.zeros(n, np.int64)
        else:
            enc = pc.dictionary_encode(arr, null_encoding="encode")
            dictionary, codes = enc.dictionary, enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        size = max(len(dictionary), 1)
        if key.max(initial=0) > (2**62) // size:  # compact before the mixed-radix key could overflow
            key = np.unique(key, return_inverse=True)[1].astype(np.int64)
        key = key * size + codes
        dictionaries.append((dictionary, codes))
    _, first, inverse, counts = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
    order = np.argsort(inverse, kind="stable")
    ordered = table.take(pa.array(order))
    out: dict[tuple, pa.Table] = {}
    start = 0
    for row, count in zip(first.tolist(), counts.tolist(), strict=True):
        value = tuple(dictionary[int(codes[row])].as_py() for dictionary, codes in dictionaries)
        out[value] = ordered.slice(start, count)
        start += count
    return out


# --------------------------------------------------------------------------------------------------------
# Region pruning
# --------------------------------------------------------------------------------------------------------

_MAX_COMBINATIONS = 4096


def _schema_type(schema: pa.Schema | None, name: str) -> pa.DataType | None:
    if schema is None:
        return None
    idx = schema.get_field_index(name)
    if idx >= 0:
        return schema.field(idx).type
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        idx = schema.get_field_index(".".join(parts[:cut]))
        if idx < 0:
            continue
        t = schema.field(idx).type
        for part in parts[cut:]:
            if not pa.types.is_struct(t) or t.get_field_index(part) < 0:
                return None
            t = t.field(t.get_field_index(part)).type
        return t
    return None


_NUMERIC = (pa.int32(), pa.uint32(), pa.int64(), pa.uint64(), pa.float32(), pa.float64())


def _literal_types(values: Sequence[Any]) -> list[pa.DataType] | None:
    """Candidate column types for untyped literals. Hashes differ between 32- and 64-bit and between
    integer and float types, so a number is tried as each (narrower integers hash like int32); a literal
    a type cannot hold exactly is skipped for that type. Pruning must only ever keep too much."""
    kinds = {type(v) for v in values if v is not None}
    if kinds <= {int, float}:
        return list(_NUMERIC)
    if kinds <= {str}:
        return [pa.string()]
    if kinds <= {bool}:
        return [pa.bool_()]
    return None


def _typed_candidates(values: Sequence[Any], typ: pa.DataType | None) -> list[pa.Array] | None:
    types = [typ] if typ is not None else _literal_types(values)
    if types is None:
        return None
    out = []
    for t in types:
        kept = []
        for v in values:
            try:  # a literal that does not fit this type cannot be a value of this column type
                kept.append(pa.array([v]).cast(t) if v is not None else pa.nulls(1, t))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OverflowError):
                if typ is not None:
                    return None  # the caller's column type does not take this literal: do not prune
        if kept:
            out.append(pa.concat_arrays(kept))
    return out


def _norm(v: Any) -> Any:
    return "\x00NaN" if isinstance(v, float) and math.isnan(v) else v


def _kind(v: Any) -> type:
    return float if isinstance(v, int | float) else type(v)  # bool, int and float compare as numbers


def _may_match(value: Any, possible: set[Any] | None) -> bool:
    if possible is None or _norm(value) in possible:
        return True
    # A region value of another kind than the computed ones (say a date against string literals, when
    # no schema gave the column type) proves nothing: keep the region.
    return value is not None and bool(possible) and _kind(value) not in {_kind(p) for p in possible}


def _possible_values(
    fld: RegionField,
    predicates: Mapping[str, Sequence[Any]],
    source_names: Mapping[int, str],
    schema: pa.Schema | None,
) -> set[Any] | None:
    """The region values rows matching the predicates can have for this field, or None if unknown."""
    if fld.expression is not None or fld.transform == "unsharded":
        return None
    try:
        names = _column_names(fld, source_names)
    except RegionSpecError:
        return None
    if fld.transform != "multi_bucket":
        names = names[:1]
    if not names or any(name not in predicates for name in names):
        return None
    per_column = []
    for name in names:
        cands = _typed_candidates(list(predicates[name]), _schema_type(schema, name))
        if cands is None:
            return None
        per_column.append(cands)
    possible: set[Any] = set()
    for typed in itertools.product(*per_column):
        sizes = [len(a) for a in typed]
        if math.prod(sizes) > _MAX_COMBINATIONS:
            return None
        if math.prod(sizes) == 0:
            continue
        grids = np.meshgrid(*[np.arange(s) for s in sizes], indexing="ij")
        cols = [a.take(pa.array(g.ravel())) for a, g in zip(typed, grids, strict=True)]
        try:
            result = _apply(fld, cols, len(cols[0]))
        except (RegionSpecError, pa.ArrowException):
            return None
        possible.update(_norm(v) for v in result.to_pylist())
    return possible


def prune(
    spec: RegionSpec,
    predicates: Mapping[str, Sequence[Any]],
    source_names: Mapping[int, str],
    region_values: Mapping[str, tuple],
    *,
    schema: pa.Schema | None = None,
) -> set[str]:
    """Region ids that may hold rows matching `predicates` ({column: allowed values}, ANDed).

    A region is dropped only if some spec field is determined by the predicates and the region's value
    for it is not among the possible ones. `schema` (the table's Arrow schema) gives literal types; without
    it, integer / float literals are tried as every width (bucket hashes differ by width) and strings as
    strings, so pass `schema` whenever a spec column is temporal (a bucket of `ts = '2024-01-01'` can
    only be computed knowing the column's unit and time zone).
    """
    possible = [_possible_values(f, predicates, source_names, schema) for f in spec.fields]
    return {
        region_id
        for region_id, values in region_values.items()
        if len(values) != len(spec.fields)
        or all(_may_match(v, p) for v, p in zip(values, possible, strict=True))
    }


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<str>'(?:[^']|'')*')
      | (?P<num>[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)(?![\w.])
      | (?P<qid>"(?:[^"]|"")+"|`[^`]+`)
      | (?P<id>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)
      | (?P<op>[=(),])
    )""",
    re.VERBOSE,
)
_MAX_FILTER_LEN = 100_000


def _tokens(sql: str) -> list[tuple[str, Any]] | None:
    out: list[tuple[str, Any]] = []
    pos = 0
    sql = sql.rstrip()
    while pos < len(sql):
        m = _TOKEN.match(sql, pos)
        if not m or m.end() == pos:
            return None
        pos = m.end()
        kind = m.lastgroup
        text = m.group(kind)
        if kind == "str":
            out.append(("lit", text[1:-1].replace("''", "'")))
        elif kind == "num":
            out.append(("lit", int(text) if re.fullmatch(r"[-+]?\d+", text) else float(text)))
        elif kind == "qid":
            out.append(("col", text[1:-1].replace('""', '"') if text[0] == '"' else text[1:-1]))
        elif kind == "id":
            up = text.upper()
            out.append(
                ("kw", up)
                if up in ("AND", "IN", "OR", "NOT", "NULL", "TRUE", "FALSE", "IS")
                else ("col", text)
            )
        else:
            out.append(("op", text))
    return out


def parse_simple_predicates(sql_filter: str) -> dict[str, list]:
    """{column: allowed values} for a filter made only of `col = lit` / `col IN (lit, ...)` joined by AND.

    Literals: integers, floats, 'strings' ('' escapes a quote). Anything else (OR, NOT, <, functions,
    NULL, parentheses around clauses, ...) returns {} meaning "no pruning". Repeated columns intersect.
    """
    if not isinstance(sql_filter, str) or len(sql_filter) > _MAX_FILTER_LEN:
        return {}
    toks = _tokens(sql_filter)
    if not toks:
        return {}
    preds: dict[str, list] = {}
    i = 0

    def at(j: int) -> tuple[str, Any]:
        return toks[j] if j < len(toks) else ("end", None)

    while True:
        kind, col = at(i)
        if kind != "col":
            return {}
        if at(i + 1) == ("op", "=") and at(i + 2)[0] == "lit":
            values = [at(i + 2)[1]]
            i += 3
        elif at(i + 1) == ("kw", "IN") and at(i + 2) == ("op", "("):
            values, i = [], i + 3
            while True:
                if at(i)[0] != "lit":
                    return {}
                values.append(at(i)[1])
                if at(i + 1) == ("op", ","):
                    i += 2
                elif at(i + 1) == ("op", ")"):
                    i += 2
                    break
                else:
                    return {}
        else:
            return {}
        unique = list(dict.fromkeys(values))
        preds[col] = [v for v in preds[col] if v in unique] if col in preds else unique
        if at(i)[0] == "end":
            return preds
        if at(i) != ("kw", "AND"):
            return {}
        i += 1
