"""S3 tests see S3 only through what the code under test passes (issue 18). The environment points at a
loopback decoy with no keys (tests/conftest.py), so these positive controls show that a location-
parametrised S3 test fails when its storage options lose the endpoint or the keys: for the writer, the
reader, merge, status and the object store in process, for the CLI in a child process, and for Lance core's point lookup
outside the one block that lends it the environment (tables.lance_core_env)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from lance.mem_wal import LsmPointLookupPlanner

from memwal.merge import merge_table
from memwal.reader import LsmReader
from memwal.status import table_status
from memwal.storage import ObjectStore
from memwal.table import MemWalTable
from memwal.writer import RegionWriter, WriterConfig

from support.s3_decoy import DECOY_MESSAGE, NOT_REACHED, S3_REMOVALS, s3_options_without
from support.tables import create_base, lance_core_env, lance_core_snapshots, open_base, rows

pytestmark = pytest.mark.s3
MEMWAL = str(Path(sys.executable).with_name("memwal"))
NEVER = WriterConfig(max_memtable_rows=10**9, max_flush_interval_s=None)


def _table(loc) -> str:
    """Base ids 0..9, MemWAL (unsharded) and one flushed generation: everything through loc's options."""
    create_base(loc, ids=range(10))
    open_base(loc).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    with RegionWriter(loc.uri, region, storage_options=loc.storage_options, config=NEVER) as w:
        w.put(rows([3, 11], "g1"))
    return region


def test_the_environment_reaches_no_s3(s3_location):
    """A client that falls back to the environment reaches the decoy, which refuses it by name."""
    _table(s3_location)
    bare = ObjectStore(s3_location.uri, {"aws_access_key_id": "x", "aws_secret_access_key": "y", "allow_http": "true"})
    with pytest.raises(Exception, match=DECOY_MESSAGE[:30]):
        bare.list("_mem_wal")


@pytest.mark.parametrize("removed", sorted(S3_REMOVALS))
def test_every_entry_point_fails_without_the_endpoint_or_keys_it_was_given(s3_location, removed):
    """Positive control for every location-parametrised S3 test: with full options the calls below work
    (the tests do exactly that); with the endpoint or the keys removed, each one fails clearly."""
    loc = s3_location
    region = _table(loc)
    assert LsmReader(MemWalTable(loc.uri, loc.storage_options)).get(11)["name"] == "g111"
    opts = s3_options_without(loc.storage_options, removed)
    attempts = {
        "writer": lambda: RegionWriter(loc.uri, region, storage_options=opts, config=NEVER),
        "reader": lambda: LsmReader(MemWalTable(loc.uri, opts)).scan(),
        "merge": lambda: merge_table(MemWalTable(loc.uri, opts)),
        "status": lambda: table_status(MemWalTable(loc.uri, opts)),
        "store": lambda: ObjectStore(loc.uri, opts).list("_mem_wal"),
    }
    for name, attempt in attempts.items():
        with pytest.raises(Exception) as err:
            attempt()
        assert NOT_REACHED.search(str(err.value)), f"{name} without the {removed}: {err.value}"
    assert LsmReader(MemWalTable(loc.uri, loc.storage_options)).get(11)["name"] == "g111", "nothing changed"


@pytest.mark.parametrize("removed", sorted(S3_REMOVALS))
def test_the_cli_reads_s3_only_through_its_storage_options(s3_location, removed):
    """The memwal CLI in a child process (the decoy environment): it works with the options it is given
    and fails with exit status 1 and a clear reason without the endpoint or the keys."""
    loc = s3_location
    _table(loc)

    def status(opts: dict[str, str]) -> subprocess.CompletedProcess:
        args = [a for k, v in opts.items() for a in ("--storage-option", f"{k}={v}")]
        return subprocess.run([MEMWAL, "status", loc.uri, "--json", *args], capture_output=True, text=True,
                              timeout=120)

    ok = status(loc.storage_options)
    assert ok.returncode == 0 and '"num_regions": 1' in ok.stdout, ok.stderr[-2000:]
    failed = status(s3_options_without(loc.storage_options, removed))
    assert failed.returncode == 1 and NOT_REACHED.search(failed.stderr.strip().splitlines()[-1]), failed.stderr[-2000:]


def test_lance_core_point_lookup_reaches_s3_only_inside_lance_core_env(s3_location):
    """Lance core's LsmPointLookupPlanner drops the storage options (a Lance core gap): it fails outside
    lance_core_env and works inside it, so that block is the only place the environment points at S3."""
    loc = s3_location
    _table(loc)
    planner = LsmPointLookupPlanner(open_base(loc), lance_core_snapshots(loc), ["id"])
    key = pa.array([11], pa.int64())
    with pytest.raises(Exception, match=NOT_REACHED):
        planner.plan_lookup(key).to_table()
    with lance_core_env(loc):
        assert planner.plan_lookup(key).to_table().column("name").to_pylist() == ["g111"]
