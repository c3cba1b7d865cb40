"""Region specs: validation, proto round trip, transforms equal to Lance core (pylance 14) and to Lance's
DataFusion for the transforms Lance core's MemWAL does not implement, routing and pruning."""

from __future__ import annotations

import glob
import math
import struct
import uuid

import lance
import mmh3
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lance.mem_wal import evaluate_sharding_spec
from lance.schema import LanceSchema

from memwal._proto import memwal_pb2
from memwal.errors import RegionSpecError
from memwal.field_ids import source_names_from_schema
from memwal.murmur3 import murmur3
from memwal.pruning import prune
from memwal.region_spec import RegionField, RegionSpec
from memwal.sql_predicates import parse_simple_predicates
from memwal.transforms import evaluate, route

BIG_N = 2**31 - 1  # with N = 2^31 - 1 a bucket shows almost all of the hash bits


def bucket(fid: str = "b", n: int = BIG_N, sources: tuple[int, ...] = (0,)) -> RegionField:
    return RegionField(fid, sources, "bucket", None, "int32", {"num_buckets": str(n)})


def transform(t: str, fid: str = "f", sources: tuple[int, ...] = (0,), result_type: str = "", **params):
    return RegionField(fid, sources, t, None, result_type, {k: str(v) for k, v in params.items()})


def spec(*fields: RegionField) -> RegionSpec:
    return RegionSpec(1, fields)


def plain(col: pa.Array | pa.ChunkedArray) -> list:
    """Python values; temporal values as their raw integers (Python's datetime cannot hold them all)."""
    t = col.type
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_temporal(t):
        col = col.view(pa.int32() if t.bit_width == 32 else pa.int64())
    return col.to_pylist()


def ours(s: RegionSpec, table: pa.Table) -> list[list]:
    out = evaluate(s, table, source_names_from_schema(table.schema))
    return [plain(c) for c in out.columns]


def lance_core(s: RegionSpec, table: pa.Table) -> list[list]:
    batch = table.combine_chunks().to_batches()[0]
    out = evaluate_sharding_spec(batch, s.to_lance_dict(), LanceSchema.from_pyarrow(table.schema))
    return [plain(c) for c in out.columns]


def datafusion(table: pa.Table, *exprs: str) -> list[list]:
    """Lance's own DataFusion evaluating the spec's SQL for a transform, row-aligned with `table`."""
    t = table.append_column("__row", pa.array(np.arange(table.num_rows), pa.int64()))
    ds = lance.write_dataset(t, f"memory://{uuid.uuid4().hex}")
    select = ", ".join(f"{e} AS r{i}" for i, e in enumerate(exprs))
    batches = ds.sql(f"SELECT {select} FROM dataset ORDER BY __row").build().to_batch_records()
    out = pa.Table.from_batches(batches)
    return [c.to_pylist() for c in out.columns]


def same(a: list, b: list) -> bool:
    def norm(v):
        return "NaN" if isinstance(v, float) and math.isnan(v) else v

    return [norm(v) for v in a] == [norm(v) for v in b]


def column(values: list, typ: pa.DataType) -> pa.Table:
    return pa.table({"c": pa.array(values, typ)})


def with_nulls(values: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(st.one_of(st.none(), values), min_size=1, max_size=40)


def ints(bits: int, signed: bool = True) -> st.SearchStrategy:
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    return st.one_of(st.sampled_from([lo, hi, 0, 1, -1 if signed else 2]), st.integers(lo, hi))


TS_RANGE = st.integers(-(2**62), 2**62)
TEXT = st.one_of(st.sampled_from(["", "a", "ab", "abc", "abcd", "é", "日本語", "🎉"]), st.text(max_size=20))
BUCKET_TYPES = {
    "int8": (pa.int8(), ints(8)),
    "int16": (pa.int16(), ints(16)),
    "int32": (pa.int32(), ints(32)),
    "int64": (pa.int64(), ints(64)),
    "uint8": (pa.uint8(), ints(8, False)),
    "uint16": (pa.uint16(), ints(16, False)),
    "uint32": (pa.uint32(), ints(32, False)),
    "uint64": (pa.uint64(), ints(64, False)),
    "float32": (pa.float32(), st.floats(width=32)),
    "float64": (pa.float64(), st.floats()),
    "bool": (pa.bool_(), st.booleans()),
    "string": (pa.string(), TEXT),
    "large_string": (pa.large_string(), TEXT),
    "date32": (pa.date32(), st.integers(-(2**31), 2**31 - 1)),
    "time32[s]": (pa.time32("s"), st.integers(0, 86399)),
    "time32[ms]": (pa.time32("ms"), st.integers(0, 86399999)),
    "time64[us]": (pa.time64("us"), st.integers(0, 86399999999)),
    "time64[ns]": (pa.time64("ns"), st.integers(0, 86399999999999)),
    "timestamp[s]": (pa.timestamp("s"), TS_RANGE),
    "timestamp[ms, UTC]": (pa.timestamp("ms", "UTC"), TS_RANGE),
    "timestamp[us, New_York]": (pa.timestamp("us", "America/New_York"), TS_RANGE),
    "timestamp[ns, +05:30]": (pa.timestamp("ns", "+05:30"), TS_RANGE),
}


def typed_column(typ: pa.DataType, values: list) -> pa.Table:
    if pa.types.is_date32(typ) or pa.types.is_time32(typ):
        return pa.table({"c": pa.array(values, pa.int32()).view(typ)})
    if pa.types.is_timestamp(typ) or pa.types.is_time64(typ):
        return pa.table({"c": pa.array(values, pa.int64()).view(typ)})
    return column(values, typ)


# ---- the spec object --------------------------------------------------------------------------------


def test_to_proto_and_from_proto_round_trip_every_field_kind():
    s = RegionSpec(
        7,
        (
            bucket("b", 16),
            RegionField("e", (1, 2), None, "col0 || col1", "utf8", {}),
            transform("truncate", "t", sources=(3,), result_type="utf8", width=4),
            transform("unsharded", "u", sources=(), result_type="int32"),
        ),
    )
    wire = s.to_proto().SerializeToString()
    assert RegionSpec.from_proto(memwal_pb2.RegionSpec.FromString(wire)) == s


def test_unset_transform_and_expression_stay_unset_in_proto():
    msg = bucket().to_proto()
    assert msg.HasField("transform") and not msg.HasField("expression")


def test_spec_written_by_lance_core_initialize_mem_wal_is_read_and_round_trips(tmp_path):
    pk = pa.field("id", pa.int64(), nullable=False, metadata={"lance-schema:unenforced-primary-key": "true"})
    ds = lance.write_dataset(pa.table({"id": [1, 2]}, schema=pa.schema([pk])), str(tmp_path))
    ds.initialize_mem_wal(bucket_column="id", num_buckets=4)
    (written,) = lance.dataset(str(tmp_path)).mem_wal_index_details()["sharding_specs"]
    s = RegionSpec.from_lance_dict(written)
    assert s == RegionSpec(1, (RegionField("bucket", (0,), "bucket", None, "int32", {"num_buckets": "4"}),))
    assert s.to_lance_dict() == written
    assert RegionSpec.from_proto(s.to_proto()) == s


def test_to_lance_dict_is_accepted_by_lance_core():
    table = column([1, 2, 3], pa.int64())
    s = spec(bucket("b", 8), transform("identity", "i", result_type="int64"))
    assert lance_core(s, table) == ours(s, table)


def test_region_field_is_hashable_and_copies_its_parameters():
    params = {"num_buckets": "4"}
    f = RegionField("b", [0], "bucket", None, "int32", params)
    params["num_buckets"] = "0"
    assert f.parameters == {"num_buckets": "4"} and f.source_ids == (0,)
    assert len({f, RegionField("b", (0,), "bucket", None, "int32", {"num_buckets": "4"})}) == 1


# ---- invalid specs ------------------------------------------------------------------------------------


def test_unknown_transform_is_rejected_naming_field_and_transform():
    with pytest.raises(RegionSpecError, match=r"'f1'.*unknown transform 'bukket'"):
        RegionField("f1", (0,), "bukket", None, "int32", {})


@pytest.mark.parametrize("t", ["bucket", "multi_bucket"])
def test_missing_num_buckets_is_rejected_naming_the_parameter(t):
    with pytest.raises(RegionSpecError, match=rf"'f1'.*{t}.*'num_buckets'"):
        RegionField("f1", (0,), t, None, "int32", {})


@pytest.mark.parametrize("value", ["0", "-3", "abc", "1.5", "", "2147483648"])
def test_num_buckets_must_be_a_positive_32_bit_integer(value):
    with pytest.raises(RegionSpecError, match=r"'f1'.*'num_buckets'"):
        RegionField("f1", (0,), "bucket", None, "int32", {"num_buckets": value})


@pytest.mark.parametrize("params", [{}, {"width": "0"}, {"width": "-1"}, {"width": "x"}])
def test_truncate_needs_a_positive_width(params):
    with pytest.raises(RegionSpecError, match=r"'f1'.*'width'"):
        RegionField("f1", (0,), "truncate", None, "", params)


@pytest.mark.parametrize(("t", "e"), [("identity", "col0"), (None, None)])
def test_exactly_one_of_transform_and_expression_is_required(t, e):
    with pytest.raises(RegionSpecError, match=r"'f1'.*exactly one of transform / expression"):
        RegionField("f1", (0,), t, e, "int32", {})


def test_evaluating_an_expression_field_raises_naming_the_field():
    s = spec(RegionField("expr_field", (0,), None, "col0 % 4", "int32", {}))
    with pytest.raises(RegionSpecError, match=r"'expr_field'.*cannot be evaluated"):
        evaluate(s, column([1], pa.int32()), {0: "c"})


def test_unknown_source_id_is_rejected_naming_the_field_and_id():
    with pytest.raises(RegionSpecError, match=r"'b'.*source field id 99"):
        evaluate(spec(bucket("b", 4, (99,))), column([1], pa.int32()), {0: "c"})


def test_spec_id_zero_and_duplicate_field_ids_are_rejected():
    with pytest.raises(RegionSpecError, match="spec id"):
        RegionSpec(0, (bucket(),))
    with pytest.raises(RegionSpecError, match="duplicate field_id 'b'"):
        RegionSpec(1, (bucket("b"), bucket("b")))


def test_bucket_on_a_type_lance_core_cannot_hash_is_rejected_as_lance_core_does():
    table, s = column([b"x"], pa.binary()), spec(bucket("bin"))
    with pytest.raises(ValueError, match="Unsupported bucket sharding column type"):
        lance_core(s, table)
    with pytest.raises(RegionSpecError, match=r"'bin'.*'bucket'.*binary"):
        ours(s, table)


def test_date_part_on_a_non_temporal_column_is_rejected_naming_the_field():
    with pytest.raises(RegionSpecError, match=r"'f'.*'year'"):
        ours(spec(transform("year")), column([1], pa.int32()))


# ---- bucket and identity: equal to Lance core -----------------------------------------------------------


@pytest.mark.parametrize("name", list(BUCKET_TYPES))
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_bucket_and_identity_equal_lance_core_row_by_row(name, data):
    typ, values = BUCKET_TYPES[name]
    table = typed_column(typ, data.draw(with_nulls(values)))
    n = data.draw(st.sampled_from([1, 3, 16, 1000, BIG_N]))
    s = spec(bucket("b", n), transform("identity", "i"))
    got, want = ours(s, table), lance_core(s, table)
    assert got[0] == want[0]
    assert same(got[1], want[1])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(min_size=250, max_size=400)), min_size=1, max_size=5))
def test_bucket_of_strings_longer_than_1kib_equals_lance_core(values):
    table = column([v * 4 if v else v for v in values], pa.string())  # up to 6.4 KiB of UTF-8
    assert ours(spec(bucket()), table) == lance_core(spec(bucket()), table)


def test_bucket_of_sliced_and_chunked_input_equals_lance_core():
    arr = pa.array(["x", None, "hello", "wörld", "abcd"] * 3, pa.string()).slice(2, 9)
    ints = pa.array(list(range(-20, 20)), pa.int64()).slice(5, 9)
    table = pa.table({"s": arr, "i": ints})
    s = spec(bucket("s", 97, (0,)), bucket("i", 97, (1,)))
    chunked = pa.concat_tables([table.slice(0, 4), table.slice(4)])
    assert ours(s, chunked) == lance_core(s, table)


def test_bucket_uses_lance_cores_reduction_not_abs():
    # murmur3(int32 1) = -68075478; abs() % (2^31 - 1) would be 68075478.
    assert murmur3(pa.array([1], pa.int32()))[0] == -68075478
    assert ours(spec(bucket(n=BIG_N)), column([1], pa.int32())) == [[-68075478 & 0x7FFFFFFF]]


# ---- hashing: what bytes Lance core feeds murmur3 -------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(ints(32), min_size=1, max_size=50), st.lists(ints(64), min_size=1, max_size=50))
def test_vectorised_murmur3_equals_mmh3_on_little_endian_32_and_64_bit_values(v32, v64):
    assert murmur3(pa.array(v32, pa.int32())).tolist() == [mmh3.hash(struct.pack("<i", v)) for v in v32]
    assert murmur3(pa.array(v64, pa.int64())).tolist() == [mmh3.hash(struct.pack("<q", v)) for v in v64]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=30).filter(lambda v: len(v.encode()) % 4 == 0), min_size=1, max_size=30))
def test_string_hash_equals_mmh3_of_the_utf8_bytes_when_their_length_is_a_multiple_of_4(values):
    assert murmur3(pa.array(values)).tolist() == [mmh3.hash(v.encode()) for v in values]


def test_string_tail_bytes_are_mixed_as_sign_extended_blocks_unlike_standard_murmur3():
    # Lance core (like Spark's hashUnsafeBytes) mixes each of the last len % 4 bytes as a whole block.
    for text in ["a", "héllo", "日本語"]:
        b = text.encode()
        (lance_bucket,) = lance_core(spec(bucket()), column([text], pa.string()))
        assert ours(spec(bucket()), column([text], pa.string())) == [lance_bucket]
        assert lance_bucket[0] != (mmh3.hash(b) & 0x7FFFFFFF) % BIG_N


def test_bucket_int8_int16_int32_uint8_uint16_land_in_same_region():
    values = [0, 1, 5, 100, 127]
    results = {
        str(t): ours(spec(bucket()), column(values, t))
        for t in [pa.int8(), pa.int16(), pa.int32(), pa.uint8(), pa.uint16(), pa.uint32()]
    }
    assert len({str(r) for r in results.values()}) == 1


def test_bucket_int32_and_int64_land_in_different_regions_as_in_lance_core():
    # The spec asks for type-promotion resistance; Lance core hashes 64-bit types as 8 bytes and
    # narrower ones as 4, so int32 5 and int64 5 differ there. We follow Lance core.
    as32, as64 = column([5], pa.int32()), column([5], pa.int64())
    assert lance_core(spec(bucket()), as32) != lance_core(spec(bucket()), as64)
    assert ours(spec(bucket()), as32) == lance_core(spec(bucket()), as32)
    assert ours(spec(bucket()), as64) == lance_core(spec(bucket()), as64)


def test_bucket_of_negative_int8_sign_extends_and_uint32_keeps_its_bits():
    def b(value, typ):
        return ours(spec(bucket()), column([value], typ))

    assert b(-1, pa.int8()) == b(-1, pa.int32())
    assert b(2**32 - 1, pa.uint32()) == b(-1, pa.int32())
    assert b(2**64 - 1, pa.uint64()) == b(-1, pa.int64())


def test_bucket_string_and_large_string_land_in_same_region():
    values = ["", "a", "héllo", "日本語"]
    as_large = ours(spec(bucket()), column(values, pa.large_string()))
    assert ours(spec(bucket()), column(values, pa.string())) == as_large


def test_bucket_maps_minus_zero_to_zero_and_every_nan_to_one_value():
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001], np.uint32).view(np.float32)
    table = pa.table({"c": pa.array(np.concatenate([np.array([0.0, -0.0], np.float32), nans]))})
    (got,) = ours(spec(bucket()), table)
    assert got[0] == got[1] and len(set(got[2:])) == 1
    assert [got] == lance_core(spec(bucket()), table)


def test_bucket_of_timestamp_hashes_the_raw_value_whatever_the_unit_or_time_zone():
    results = [
        ours(spec(bucket()), typed_column(t, [1_700_000_000]))
        for t in [pa.timestamp("s"), pa.timestamp("ns", "UTC"), pa.timestamp("ms", "Asia/Tokyo"), pa.int64()]
    ]
    assert all(r == results[0] for r in results)


def test_bool_hashes_as_int32_zero_and_one():
    as_int = ours(spec(bucket()), column([1, 0], pa.int32()))
    assert ours(spec(bucket()), column([True, False], pa.bool_())) == as_int


# ---- NULL rules ---------------------------------------------------------------------------------------


def test_bucket_of_null_is_bucket_0_as_in_lance_core_not_null_as_the_spec_says():
    table = column([None, 7], pa.int64())
    assert ours(spec(bucket("b", 8)), table)[0][0] == 0
    assert lance_core(spec(bucket("b", 8)), table)[0][0] == 0


def test_identity_date_parts_and_truncate_of_null_are_null():
    table = pa.table({"d": pa.array([None], pa.timestamp("us")), "s": pa.array([None], pa.string())})
    s = spec(
        transform("identity", "i"),
        *(transform(p, p) for p in ("year", "month", "day", "hour")),
        transform("truncate", "t", sources=(1,), width=2),
    )
    assert ours(s, table) == [[None]] * 6


def test_multi_bucket_ignores_null_columns():
    table = pa.table({"a": pa.array([1, None, 3], pa.int32()), "b": pa.array([None, "x", "y"])})
    multi = ours(spec(transform("multi_bucket", "m", (0, 1), num_buckets=1000)), table)[0]
    alone_a = ours(spec(bucket("a", 1000, (0,))), table)[0]
    alone_b = ours(spec(bucket("b", 1000, (1,))), table)[0]
    assert multi[0] == alone_a[0] and multi[1] == alone_b[1]


def test_multi_bucket_is_null_only_when_every_column_is_null():
    table = pa.table({"a": pa.array([None, None, 1], pa.int32()), "b": pa.array([None, "x", None])})
    (got,) = ours(spec(transform("multi_bucket", "m", (0, 1), num_buckets=10)), table)
    assert got[0] is None and got[1] is not None and got[2] is not None


def test_multi_bucket_chains_lance_hashes_with_the_previous_hash_as_seed():
    # No multi_bucket in Lance core 14; ours continues Lance's per-type hash with seed = previous hash.
    table = pa.table({"a": pa.array([12], pa.int32()), "b": pa.array([34], pa.int64())})
    seed = mmh3.hash(struct.pack("<i", 12), 0, signed=False)
    want = (mmh3.hash(struct.pack("<q", 34), seed, signed=False) & 0x7FFFFFFF) % BIG_N
    assert ours(spec(transform("multi_bucket", "m", (0, 1), num_buckets=BIG_N)), table) == [[want]]


def test_evaluate_of_an_empty_table_gives_each_field_its_result_type():
    schema = pa.schema([("i", pa.int64()), ("s", pa.string()), ("t", pa.timestamp("us", "Europe/Paris"))])
    s = spec(
        bucket("b", 4, (0,)),
        transform("multi_bucket", "m", (0, 1), num_buckets=4),
        transform("year", "y", (2,)),
        transform("truncate", "tr", (1,), width=3),
        transform("identity", "id", (0,)),
    )
    out = evaluate(s, schema.empty_table(), source_names_from_schema(schema))
    assert out.num_rows == 0
    assert out.schema.types == [pa.int32(), pa.int32(), pa.int32(), pa.string(), pa.int64()]


def test_missing_source_column_reads_as_null():
    table = column([1, 2], pa.int32())
    s = spec(
        bucket("b", 8, (5,)),
        transform("identity", "i", (5,), result_type="utf8"),
        transform("year", "y", (5,)),
    )
    out = evaluate(s, table, {5: "dropped_column"})
    assert out.column("region_field_b").to_pylist() == [0, 0]
    assert out.column("region_field_i").type == pa.string()
    assert out.column("region_field_i").to_pylist() == [None, None]
    assert out.column("region_field_y").to_pylist() == [None, None]


# ---- date parts and truncate: equal to Lance's DataFusion ---------------------------------------------

TEMPORAL = {
    "date32": (pa.date32(), st.integers(-719162, 2932896)),
    "date64": (pa.date64(), st.integers(-(10**13), 10**13).map(lambda v: v - v % 86_400_000)),
    "timestamp[s]": (pa.timestamp("s"), st.integers(-(10**10), 10**10)),
    "timestamp[ms, UTC]": (pa.timestamp("ms", "UTC"), st.integers(-(10**13), 10**13)),
    "timestamp[us, New_York]": (pa.timestamp("us", "America/New_York"), st.integers(-(10**16), 10**16)),
    "timestamp[ns, +05:30]": (pa.timestamp("ns", "+05:30"), st.integers(-(2**62), 2**62)),
    "timestamp[us, Kathmandu]": (pa.timestamp("us", "Asia/Kathmandu"), st.integers(-(10**16), 10**16)),
    "timestamp[s, Sydney]": (pa.timestamp("s", "Australia/Sydney"), st.integers(-(10**10), 10**10)),
}


@pytest.mark.parametrize("name", list(TEMPORAL))
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_date_parts_equal_datafusion_date_part(name, data):
    typ, values = TEMPORAL[name]
    raw = data.draw(with_nulls(values))
    table = pa.table({"c": pa.array(raw, pa.int32() if typ == pa.date32() else pa.int64()).view(typ)})
    parts = ("year", "month", "day", "hour")
    got = ours(spec(*(transform(p, p) for p in parts)), table)
    assert got == datafusion(table, *(f"date_part('{p}', c)" for p in parts))


def test_date_parts_apply_daylight_saving_until_2100_as_datafusion_does():
    # pyarrow alone drops DST after 2037; DataFusion (chrono-tz) keeps it until 2100, then freezes.
    instants = ["2067-03-13T07:30:00", "2067-07-01T12:00:00", "2150-07-01T12:00:00", "2150-01-01T12:00:00"]
    for zone in ["America/New_York", "Australia/Sydney", "Europe/London"]:
        table = pa.table({"c": pa.array(instants).cast(pa.timestamp("s")).cast(pa.timestamp("s", zone))})
        assert ours(spec(transform("hour"), transform("day", "d")), table) == datafusion(
            table, "date_part('hour', c)", "date_part('day', c)"
        )


def test_hour_of_a_time_zone_aware_timestamp_is_local_time():
    table = pa.table({"c": pa.array([0], pa.timestamp("us", "America/New_York"))})
    assert ours(spec(transform("hour"), transform("day", "d")), table) == [[19], [31]]


TRUNCATABLE = {
    "int8": (pa.int8(), ints(8)),
    "int16": (pa.int16(), ints(16)),
    "int32": (pa.int32(), ints(32)),
    "int64": (pa.int64(), ints(64)),
    "uint8": (pa.uint8(), ints(8, False)),
    "uint32": (pa.uint32(), ints(32, False)),
    "uint64": (pa.uint64(), ints(64, False)),
    "float32": (pa.float32(), st.floats(width=32)),
    "float64": (pa.float64(), st.floats()),
    "string": (pa.string(), TEXT),
    "large_string": (pa.large_string(), TEXT),
}


@pytest.mark.parametrize("name", list(TRUNCATABLE))
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_truncate_equals_datafusion(name, data):
    typ, values = TRUNCATABLE[name]
    table = column(data.draw(with_nulls(values)), typ)
    width = data.draw(st.one_of(st.integers(1, 12), st.integers(1, 2**31 - 1)))
    (got,) = ours(spec(transform("truncate", width=width)), table)
    sql = f"left(c, {width})" if "string" in name else f"c - (c % {width})"
    (want,) = datafusion(table, sql)
    assert same(got, want)


def test_truncate_keeps_the_source_type_and_rounds_negatives_toward_zero():
    out = evaluate(spec(transform("truncate", width=5)), column([-7, 7, -5, None], pa.int8()), {0: "c"})
    assert out.column(0).type == pa.int8()
    assert out.column(0).to_pylist() == [-5, 5, -5, None]


def test_truncate_of_strings_counts_characters_not_bytes():
    assert ours(spec(transform("truncate", width=2)), column(["héllo", "🎉🎉🎉", "a", ""], pa.string())) == [
        ["hé", "🎉🎉", "a", ""]
    ]


# ---- source field ids ---------------------------------------------------------------------------------


def lance_ids(schema: pa.Schema) -> dict[int, str]:
    out = {}

    def walk(f, prefix):
        out[f.id()] = prefix + f.name()
        for c in f.children():
            walk(c, prefix + f.name() + ".")

    for f in LanceSchema.from_pyarrow(schema).fields():
        walk(f, "")
    return out


def test_field_ids_without_metadata_follow_lance_including_nested_children():
    schema = pa.schema(
        [
            ("a", pa.int64()),
            ("s", pa.struct([("x", pa.int32()), ("y", pa.list_(pa.struct([("p", pa.int8())])))])),
            ("m", pa.map_(pa.string(), pa.int32())),
            ("v", pa.list_(pa.float32(), 4)),
            ("fs", pa.list_(pa.struct([("u", pa.int8())]), 2)),
            ("ll", pa.large_list(pa.string())),
            ("b", pa.string()),
        ]
    )
    assert source_names_from_schema(schema) == lance_ids(schema)
    assert source_names_from_schema(schema)[1] == "s" and source_names_from_schema(schema)[2] == "s.x"


def test_field_ids_are_not_top_level_positions_once_a_struct_precedes_the_column():
    schema = pa.schema([("a", pa.int64()), ("s", pa.struct([("x", pa.int32())])), ("b", pa.string())])
    assert source_names_from_schema(schema) == {0: "a", 1: "s", 2: "s.x", 3: "b"}


def test_field_ids_are_read_from_a_wal_entry_written_by_lance_core(tmp_path):
    pk = pa.field("id", pa.int64(), nullable=False, metadata={"lance-schema:unenforced-primary-key": "true"})
    schema = pa.schema([pk, pa.field("s", pa.struct([("x", pa.int64())])), pa.field("v", pa.string())])
    table = pa.table({"id": [1, 2], "s": [{"x": 1}, {"x": 2}], "v": ["a", "b"]}, schema=schema)
    ds = lance.write_dataset(table, str(tmp_path))
    ds.initialize_mem_wal(bucket_column="v", num_buckets=2)
    writer = lance.dataset(str(tmp_path)).mem_wal_writer(str(uuid.uuid4()))
    writer.put(table)
    writer.close()
    (wal_entry,) = glob.glob(f"{tmp_path}/_mem_wal/*/wal/*.arrow")
    with open(wal_entry, "rb") as fh:
        wal_schema = ipc.open_stream(fh.read()).schema
    assert source_names_from_schema(wal_schema) == {0: "id", 1: "s", 2: "s.x", 3: "v"}
    (written,) = lance.dataset(str(tmp_path)).mem_wal_index_details()["sharding_specs"]
    assert written["fields"][0]["source_ids"] == [3]


def test_metadata_field_ids_win_over_positions():
    schema = pa.schema(
        [pa.field("b", pa.string(), metadata={"lance:field_id": "7"}), pa.field("_tombstone", pa.bool_())]
    )
    assert source_names_from_schema(schema) == {7: "b"}


def test_a_nested_source_field_is_read_from_inside_its_struct():
    table = pa.table({"s": pa.array([{"x": 1}, None, {"x": 3}], pa.struct([("x", pa.int32())]))})
    out = evaluate(spec(transform("identity", sources=(1,))), table, source_names_from_schema(table.schema))
    assert out.column(0).to_pylist() == [1, None, 3]


def test_column_parameter_overrides_source_ids_as_in_lance_core():
    table = pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]})
    s = spec(RegionField("b", (99,), "bucket", None, "int32", {"num_buckets": "8", "column": "v"}))
    assert ours(s, table) == lance_core(s, table)


# ---- routing ------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.one_of(st.none(), ints(64)), st.one_of(st.none(), st.sampled_from("abc"))),
        min_size=1,
        max_size=60,
    )
)
def test_route_puts_every_row_in_exactly_the_group_of_its_region_value(rows):
    table = pa.table(
        {
            "k": pa.array([r[0] for r in rows], pa.int64()),
            "t": pa.array([r[1] for r in rows], pa.string()),
            "row": pa.array(range(len(rows)), pa.int64()),
        }
    )
    s = spec(bucket("b", 4, (0,)), transform("identity", "i", (1,)))
    names = source_names_from_schema(table.schema)
    groups = route(s, table, names)
    seen = []
    for value, group in groups.items():
        regions = evaluate(s, group, names)
        assert set(zip(*(c.to_pylist() for c in regions.columns), strict=True)) == {value}
        order = group.column("row").to_pylist()
        assert order == sorted(order)  # rows keep their order inside a region
        seen += order
    assert sorted(seen) == list(range(len(rows)))


def test_route_of_a_million_int64_rows_fills_every_bucket():
    """Its speed is measured in bench/route.py against Lance core, not bounded here."""
    ids = np.random.default_rng(1).integers(-(2**63), 2**63 - 1, 1_000_000, dtype=np.int64)
    table = pa.table({"id": ids})
    groups = route(spec(bucket("b", 16)), table, {0: "id"})
    assert sum(g.num_rows for g in groups.values()) == 1_000_000 and len(groups) == 16


def test_route_of_an_empty_batch_is_empty():
    assert route(spec(bucket()), column([], pa.int64()), {0: "c"}) == {}


# ---- pruning ------------------------------------------------------------------------------------------

USERS = pa.schema([("user_id", pa.int64()), ("country", pa.string()), ("n", pa.int32())])
TEN_BUCKETS = spec(bucket("b", 10, (0,)))
BUCKET_REGIONS = {f"r{i}": (i,) for i in range(10)}


def bucket_of(value: int, typ: pa.DataType | None = None, n: int = 10) -> int:
    return ours(spec(bucket("b", n)), column([value], typ or pa.int64()))[0][0]


def test_prune_keeps_only_the_bucket_of_an_equality_predicate():
    kept = prune(TEN_BUCKETS, {"user_id": [123]}, {0: "user_id"}, BUCKET_REGIONS, schema=USERS)
    assert kept == {f"r{bucket_of(123)}"}
    assert lance_core(TEN_BUCKETS, column([123], pa.int64())) == [[bucket_of(123)]]


def test_prune_keeps_the_buckets_of_every_in_value():
    values = [1, 2, 3, 500]
    kept = prune(TEN_BUCKETS, {"user_id": values}, {0: "user_id"}, BUCKET_REGIONS, schema=USERS)
    assert kept == {f"r{bucket_of(v)}" for v in values}


def test_prune_keeps_every_region_when_the_predicates_miss_the_spec_columns():
    assert prune(TEN_BUCKETS, {"country": ["DE"]}, {0: "user_id"}, BUCKET_REGIONS) == set(BUCKET_REGIONS)


def test_prune_without_schema_keeps_the_buckets_of_every_integer_width():
    kept = prune(TEN_BUCKETS, {"user_id": [123]}, {0: "user_id"}, BUCKET_REGIONS)
    assert {f"r{bucket_of(123, pa.int32())}", f"r{bucket_of(123, pa.int64())}"} <= kept


def test_prune_constrains_only_the_fields_the_predicates_determine():
    s = spec(bucket("b", 4, (0,)), transform("identity", "c", (1,)))
    regions = {f"{b}-{c}": (b, c) for b in range(4) for c in ("DE", "FR", None)}
    kept = prune(s, {"country": ["FR", "DE"]}, {0: "user_id", 1: "country"}, regions, schema=USERS)
    assert kept == {f"{b}-{c}" for b in range(4) for c in ("DE", "FR")}


def test_prune_keeps_every_region_of_an_expression_field_or_an_unusable_literal():
    s = spec(RegionField("e", (0,), None, "col0 % 10", "int32", {}))
    assert prune(s, {"user_id": [1]}, {0: "user_id"}, BUCKET_REGIONS) == set(BUCKET_REGIONS)
    kept = prune(TEN_BUCKETS, {"user_id": ["not a number"]}, {0: "user_id"}, BUCKET_REGIONS, schema=USERS)
    assert kept == set(BUCKET_REGIONS)


def test_prune_of_multi_bucket_needs_every_source_column():
    s = spec(transform("multi_bucket", "m", (0, 1), num_buckets=8))
    regions = {f"r{i}": (i,) for i in range(8)}
    names = {0: "user_id", 1: "country"}
    assert prune(s, {"user_id": [5]}, names, regions, schema=USERS) == set(regions)
    table = pa.table({"user_id": pa.array([5], pa.int64()), "country": ["DE"]})
    (want,) = evaluate(s, table, names).column(0).to_pylist()
    assert prune(s, {"user_id": [5], "country": ["DE"]}, names, regions, schema=USERS) == {f"r{want}"}


def test_prune_of_identity_on_dates_needs_the_schema_to_read_string_literals():
    s = spec(transform("identity", "d", (0,)))
    days = pa.array([0, 1, 2], pa.int32()).view(pa.date32()).to_pylist()
    regions = {f"r{i}": (d,) for i, d in enumerate(days)}
    preds = {"day": ["1970-01-02"]}
    assert prune(s, preds, {0: "day"}, regions) == set(regions)  # kinds differ: nothing is proven
    assert prune(s, preds, {0: "day"}, regions, schema=pa.schema([("day", pa.date32())])) == {"r1"}


def test_prune_without_schema_keeps_the_float_reading_of_an_integer_literal():
    kept = prune(TEN_BUCKETS, {"user_id": [1]}, {0: "user_id"}, BUCKET_REGIONS)
    assert {f"r{bucket_of(1, pa.float64())}", f"r{bucket_of(1, pa.float32())}"} <= kept


def test_prune_without_schema_keeps_the_uint32_reading_of_a_large_integer():
    as_uint32 = bucket_of(2**32 - 1, pa.uint32())
    kept = prune(TEN_BUCKETS, {"user_id": [2**32 - 1]}, {0: "user_id"}, BUCKET_REGIONS)
    assert f"r{as_uint32}" in kept


def test_prune_with_an_empty_value_list_keeps_nothing():
    assert prune(TEN_BUCKETS, {"user_id": []}, {0: "user_id"}, BUCKET_REGIONS, schema=USERS) == set()


def test_prune_of_a_parsed_filter_matches_the_rows_that_satisfy_it():
    ids = pa.array(range(-50, 50), pa.int64())
    table = pa.table({"user_id": ids})
    groups = route(TEN_BUCKETS, table, {0: "user_id"})
    regions = {f"r{k[0]}": k for k in groups}
    preds = parse_simple_predicates("user_id IN (3, -7, 42) AND user_id = 42")
    kept = prune(TEN_BUCKETS, preds, {0: "user_id"}, regions, schema=USERS)
    holding_42 = {r for r, k in regions.items() if 42 in groups[k].column("user_id").to_pylist()}
    assert kept == holding_42


@pytest.mark.parametrize(
    ("sql", "parsed"),
    [
        ("user_id = 123", {"user_id": [123]}),
        ("user_id IN (1, 2, 2, -3)", {"user_id": [1, 2, -3]}),
        ("a = 1.5 and b in ('x', 'it''s') AND c = -2e3", {"a": [1.5], "b": ["x", "it's"], "c": [-2000.0]}),
        ("\"Odd Col\" = 'é'", {"Odd Col": ["é"]}),
        ("s.x = 4", {"s.x": [4]}),
        ("a IN (1, 2, 3) AND a IN (2, 3, 4) AND a = 3", {"a": [3]}),
        ("a = 1 AND a = 2", {"a": []}),
    ],
)
def test_parse_simple_predicates_reads_equalities_and_in_lists_joined_by_and(sql, parsed):
    assert parse_simple_predicates(sql) == parsed


@pytest.mark.parametrize(
    "sql",
    [
        "",
        "a = 1 OR b = 2",
        "a NOT IN (1)",
        "a < 3",
        "a = NULL",
        "a = b",
        "(a = 1)",
        "f(a) = 1",
        "a = 1 AND",
        "a IN (1, 2",
        "a IN ()",
        "a = 'unterminated",
        "a = 1; DROP TABLE t",
        "a = 1 - 2",
        "a IS NULL",
        "1 = a",
    ],
)
def test_parse_simple_predicates_returns_nothing_for_anything_else(sql):
    assert parse_simple_predicates(sql) == {}
