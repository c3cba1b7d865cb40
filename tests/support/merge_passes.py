"""Test helper: the merge's two-pass tables and the check that the LSM view is exact at every version
(tests/library/test_merge_passes.py, tests/spark/test_spark_merge_apply.py)."""

from __future__ import annotations

import uuid

import lance

from memwal.mem_wal_index import read_details_at
from memwal.reader import LsmReader
from memwal.table import MemWalTable

from support.maintenance import write_generations
from support.tables import open_base, rows, view


def passes_table(loc, gens, fragment_rows: int = 1024) -> str:
    """Base ids 0..9 (fragments of fragment_rows rows), a BTREE on the key, MemWAL, and one region whose
    generations are gens: (put_ids, tag, delete_ids) each. Returns the region id."""
    lance.write_dataset(rows(range(10), "base"), loc.uri, max_rows_per_file=fragment_rows)
    open_base(loc).create_scalar_index("id", "BTREE")
    open_base(loc).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    write_generations(loc, region, gens)
    return region


def lsm_view(loc, version=None) -> dict:
    return view(LsmReader(MemWalTable(loc.uri, loc.storage_options), version=version).scan())


def exact_everywhere(loc, v0: int, model: dict) -> None:
    """The LSM view equals the model at every version from v0 on, progress never goes back, and the
    latest base table is the model (everything merged)."""
    merged = []
    for v in range(v0, open_base(loc).version + 1):
        assert lsm_view(loc, v) == model, f"the LSM view at table version {v} differs from the model"
        merged.append(dict(read_details_at(loc.store(), v).merged_generations))
    for region in merged[-1]:
        gens = [m.get(region, 0) for m in merged]
        assert gens == sorted(gens), f"merged_generations went back: {gens}"
    assert view(open_base(loc).to_table()) == model
