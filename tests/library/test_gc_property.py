"""Property: GC never removes anything that an LSM read at any retained table version still needs."""

import shutil
import tempfile
import uuid
from datetime import timedelta

import lance
import pyarrow as pa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from memwal.catchup import catchup_table
from memwal.gc import GcConfig, gc_table
from memwal.mem_wal_index import load_index
from memwal.reader import LsmReader
from memwal.writer import RegionWriter, WriterConfig

from support.maintenance import merge_region
from support.tables import SCHEMA, rows

KEYS = st.integers(0, 15)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.lists(KEYS, min_size=1, max_size=4, unique=True)),
        st.tuples(st.just("delete"), st.lists(KEYS, min_size=1, max_size=3, unique=True)),
        st.tuples(st.just("flush"), st.just(None)),
        st.tuples(st.just("merge"), st.integers(0, 3)),  # 0 = all, else up to that many more generations
        st.tuples(st.just("catchup"), st.just(None)),
        st.tuples(st.just("cleanup"), st.just(None)),  # Lance drops every table version but the latest
        st.tuples(st.just("gc"), st.just(None)),
    ),
    min_size=4,
    max_size=18,
)


# Certain, not drawn: three generations, a merge of one more (a partial merge), GC after Lance's cleanup.
PARTIAL_MERGE_THEN_GC = [
    ("put", [1, 5]), ("flush", None), ("put", [5, 6]), ("flush", None), ("delete", [1]), ("flush", None),
    ("merge", 1), ("catchup", None), ("cleanup", None), ("gc", None), ("put", [7]), ("merge", 0),
]


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=OPS)
@example(ops=PARTIAL_MERGE_THEN_GC)
def test_lsm_read_at_every_retained_version_survives_gc(ops):
    tmp = tempfile.mkdtemp()
    try:
        uri = f"{tmp}/t"
        lance.write_dataset(rows(range(4), "base"), uri, schema=SCHEMA)
        ds = lance.dataset(uri)
        ds.initialize_mem_wal(unsharded=True)
        ds.create_scalar_index("name", "BTREE", name="name_idx")
        region = str(uuid.uuid4())
        w = RegionWriter(uri, region, config=WriterConfig(max_memtable_rows=10**9, max_flush_interval_s=None))
        model = {i: f"base{i}" for i in range(4)}  # what a reader must see once everything is flushed
        partial_merges = 0
        for step, (op, arg) in enumerate(ops):
            if op == "put":
                w.put(rows(arg, f"s{step}-"))
                model.update({k: f"s{step}-{k}" for k in arg})
            elif op == "delete":
                w.delete(pa.table({"id": pa.array(arg, pa.int64())}))
                for k in arg:
                    model.pop(k, None)
            elif op == "flush":
                w.flush()
            elif op == "merge":
                merged = load_index(uri).merged_generations.get(region, 0)
                highest = w.manifest.current_generation - 1
                up_to = highest if arg == 0 else min(highest, merged + arg)
                if up_to > merged:
                    merge_region(uri, None, region, up_to_generation=up_to)
                    partial_merges += up_to < highest
                assert load_index(uri).merged_generations.get(region, 0) == max(merged, up_to), \
                    f"merge {arg}: merged {merged} -> expected {max(merged, up_to)} ({ops})"
            elif op == "catchup":
                catchup_table(uri)
            elif op == "cleanup":
                lance.dataset(uri).cleanup_old_versions(older_than=timedelta(0))
            elif op == "gc":
                gc_table(uri, config=GcConfig(grace_period_s=0, keep_manifest_versions=1))
        w.flush()
        gc_table(uri, config=GcConfig(grace_period_s=0, keep_manifest_versions=1))
        for v in sorted(int(x["version"]) for x in lance.dataset(uri).versions()):
            view = LsmReader(uri, version=v).scan(columns=["id", "name"])
            got = dict(zip(view.column("id").to_pylist(), view.column("name").to_pylist(), strict=True))
            assert got == model, f"an LSM read at retained version {v} lost data after GC ({ops})"
        if ops == PARTIAL_MERGE_THEN_GC:
            assert partial_merges == 1, "the explicit example merges part of the pending generations"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
