"""The Spark merge's executors against a misbehaving S3 (issue 42): the table's storage options name the fault
proxy (tests/support/fault_proxy.py), so the executors' requests (the Spark dedup's staged files through our
object store, the fragment apply's Lance reads and writes) go through it as the driver's do. Faults forced on
the staged files' keys land on requests only executors make; the merge still ends exact and merged once."""

from __future__ import annotations

import dataclasses
import re
import uuid

import lance
import pytest

from memwal.mem_wal_index import load_index
from memwal.merge import MergeConfig, merge_table
from memwal.table import MemWalTable
from spark_jobs.merge_dedup import spark_dedup
from spark_jobs.task_runner import spark_runner

from support.fault_proxy import FaultProxy
from support.maintenance import write_generations
from support.merge_passes import exact_everywhere, lsm_view
from support.tables import open_base, rows

pytestmark = pytest.mark.spark

GENS = [([20, 21, 5], "g1", [3, 4]), ([3, 7], "g2", [20]), ([21, 0], "g3", [9])]
STAGED = r"^table/_mem_wal/_staging/merge-[^/]+/u\d+/part-"  # the dedup's staged files: written on executors only


def _table(loc) -> str:
    """Base ids 0..9 in fragments of 3 rows, a BTREE on the key, MemWAL and one region with GENS, written
    straight to moto (not through the proxy)."""
    lance.write_dataset(rows(range(10), "base"), loc.uri, max_rows_per_file=3, storage_options=loc.storage_options)
    open_base(loc).create_scalar_index("id", "BTREE")
    open_base(loc).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    write_generations(loc, region, GENS)
    return region


def _merge_on_spark(spark, loc, proxy: FaultProxy):
    """The `spark` engine's merge: the dedup on executors staging every batch (none inline), the fragment
    apply's tasks on executors; the driver's table handle and the tasks' storage options name the proxy."""
    return merge_table(MemWalTable(loc.uri, proxy.options(loc.storage_options)),
                       config=MergeConfig(max_generations_per_commit=1, apply="fragments"),
                       dedup=spark_dedup(spark, inline_bytes=0), runner=spark_runner(spark, "fault test"),
                       parallelism=2)


def _exact_everywhere(loc, v0: int, model: dict, region: str) -> None:
    """Every table version from v0 on reads as the model (nothing half-done visible), merged_generations never
    goes back and ends at the last generation, and the base equals the model."""
    exact_everywhere(loc, v0, model)
    assert dict(load_index(loc.uri, loc.storage_options).merged_generations) == {region: len(GENS)}


def _faulted(proxy: FaultProxy, kind: str, method: str, key: str) -> list[str]:
    return [k for m, k, f in proxy.log if f == kind and m == method and re.search(key, k)]


def test_the_spark_merge_through_503s_on_every_method_equals_the_model(spark, s3_endpoint, s3_location):
    """10% of all requests (every method, driver and executors alike) answer 503 SlowDown, and the first two
    PUTs of staged files (the executors' dedup output) certainly do: the clients retry, the merge completes
    and the base equals the model at every version."""
    loc = s3_location
    region = _table(loc)
    model, v0 = lsm_view(loc), open_base(loc).version
    with FaultProxy(s3_endpoint, rates={"503": 0.1}, seed=42) as proxy:
        proxy.plan("503", method="PUT", key=STAGED, times=2)
        summary = _merge_on_spark(spark, loc, proxy)
    assert not summary.failed_regions, summary
    assert len(_faulted(proxy, "503", "PUT", STAGED)) >= 2, "the executors' staged-file writes met 503s"
    assert [k for m, k, _ in proxy.log if m == "PUT" and re.search(r"^table/data/", k)], "the apply's fragments"
    assert set(proxy.injected) == {"503"}
    _exact_everywhere(loc, v0, model, region)


def test_the_spark_merge_through_lost_answers_merges_exactly_once(spark, s3_endpoint, s3_location):
    """Lost answers (the write lands, its answer never arrives) on an executor's staged-file write, on an
    executor's fragment write of the apply (before the driver's first commit) and on the driver's first Lance
    commit (the apply's Update): the clients retry the overwrites, Lance recognises its own commit, so the
    merge completes with no conflict; each generation is merged once and every version reads exact."""
    loc = s3_location
    region = _table(loc)
    model, v0 = lsm_view(loc), open_base(loc).version
    with FaultProxy(s3_endpoint) as proxy:
        proxy.plan("lost", method="PUT", key=STAGED)
        proxy.plan("lost", method="PUT", key=r"^table/data/.*\.lance$")
        proxy.plan("lost", method="PUT", key=r"^table/_versions/")
        summary = _merge_on_spark(spark, loc, proxy)
        assert proxy.pending() == 0 and proxy.injected == {"lost": 3}
    assert not summary.failed_regions, summary
    assert len(_faulted(proxy, "lost", "PUT", STAGED)) == 1, "an executor's staged-file write lost its answer"
    commits = [i for i, (m, k, _) in enumerate(proxy.log) if m == "PUT" and k.startswith("table/_versions/")]
    (lost_data,) = [i for i, (m, k, f) in enumerate(proxy.log) if f == "lost" and k.startswith("table/data/")]
    assert lost_data < commits[0], "the lost fragment write is an apply task's, before the driver's commits"
    assert [(r.generations, r.conflicts) for r in summary.regions] == [([1, 2, 3], 0)]
    _exact_everywhere(loc, v0, model, region)


def test_a_staged_write_that_keeps_failing_on_an_executor_fails_the_region_cleanly_and_the_rerun_converges(
        spark, s3_endpoint, s3_location):
    """One retry allowed; an executor's staged-file write answers 503 twice: the dedup batch fails on the
    executor with one line naming the table, the operation, the object and the fault, the region is reported
    failed with it and nothing is committed; every version reads exact; the rerun merges everything once."""
    loc = s3_location
    region = _table(loc)
    model, v0 = lsm_view(loc), open_base(loc).version
    with FaultProxy(s3_endpoint) as proxy:
        proxy.plan("503", method="PUT", key=STAGED.replace(r"u\d+", "u00000"), times=2)  # one file, and its retry
        few_retries = dataclasses.replace(loc, storage_options={**loc.storage_options, "client_max_retries": "1",
                                                                "client_retry_timeout": "10"})
        failed = _merge_on_spark(spark, few_retries, proxy)
        assert proxy.injected == {"503": 2}
        (key,) = {k for _, k, f in proxy.log if f == "503"}
        error = failed.regions[0].error or ""
        assert failed.failed_regions == [region] and "\n" not in error, failed
        assert f"object store put of {key.removeprefix('table/')} in table {loc.uri} failed: " in error, error
        assert "503 Service Unavailable" in error and "SlowDown" in error and "after 1 retries" in error, error
        assert open_base(loc).version == v0, "nothing committed"
        again = _merge_on_spark(spark, loc, proxy)
    assert not again.failed_regions and again.regions[0].generations == [1, 2, 3], again
    _exact_everywhere(loc, v0, model, region)
