"""Test helper: a MemWAL table with regions and flushed generations, built through our writer."""

from __future__ import annotations

import uuid

import pyarrow as pa

from memwal.writer import RegionWriter, WriterConfig

from support.tables import create_base, open_base, rows

ONE_GEN_PER_FLUSH = WriterConfig(max_memtable_rows=10**9, max_flush_interval_s=None)


def build_table(loc, regions: int = 2, generations: int = 3, base_ids=range(10), **init) -> list[str]:
    """Each region r writes `generations` generations of keys 1000*(r+1) + ... (under a region spec, only
    keys of key 1000*(r+1)'s region values: a region holds its own keys); returns the region ids."""
    create_base(loc, ids=base_ids)
    open_base(loc).initialize_mem_wal(**(init or {"unsharded": True}))
    ids = [str(uuid.uuid4()) for _ in range(regions)]
    for r, region in enumerate(ids):
        keys = _keys_of_one_region(loc, range(1000 * (r + 1), 1000 * (r + 2)))
        with RegionWriter(loc.uri, region, storage_options=loc.storage_options, config=ONE_GEN_PER_FLUSH) as w:
            for g in range(generations):
                w.put(rows([keys[g], keys[100 + g]], f"r{r}g{g}"))
                if g == 1:
                    w.delete(pa.table({"id": pa.array([keys[0]], pa.int64())}))
                w.flush()
    return ids


def _keys_of_one_region(loc, candidates: range) -> list[int]:
    """The candidate keys whose region values (newest region spec) are those of the first candidate: all of
    them under an unsharded spec."""
    from memwal.field_ids import source_names_from_schema
    from memwal.mem_wal_index import load_index
    from memwal.transforms import evaluate

    details = load_index(loc.uri, loc.storage_options).details
    spec = details.region_spec(details.newest_region_spec_id)
    values = evaluate(spec, rows(candidates), source_names_from_schema(open_base(loc).schema))
    tuples = list(zip(*(c.to_pylist() for c in values.columns), strict=True))
    return [k for k, t in zip(candidates, tuples, strict=True) if t == tuples[0]]


def write_generations(loc, region: str, gens) -> None:
    """gens: (put_ids, tag, delete_ids) per generation, each flushed on its own by one writer of region."""
    with RegionWriter(loc.uri, region, storage_options=loc.storage_options, config=ONE_GEN_PER_FLUSH) as w:
        for put_ids, tag, delete_ids in gens:
            if put_ids:
                w.put(rows(put_ids, tag))
            if delete_ids:
                w.delete(pa.table({"id": pa.array(delete_ids, pa.int64())}))
            w.flush()


def flush_generation(loc, region: str, upserts: pa.Table | None, deletes=()) -> None:
    """One flushed generation of region: the upserts (if any rows), then deletes of the `deletes` ids."""
    with RegionWriter(loc.uri, region, storage_options=loc.storage_options, config=ONE_GEN_PER_FLUSH) as w:
        if upserts is not None and upserts.num_rows:
            w.put(upserts)
        if deletes:
            w.delete(pa.table({"id": pa.array(list(deletes), pa.int64())}))
        w.flush()


def merge_without_our_lock(uri, storage_options, region, **kwargs):
    """A merge by another tool that does not take our MemWAL index lock (to stage Lance's rebase)."""
    from contextlib import nullcontext

    from memwal.table import MemWalTable

    table = MemWalTable(uri, storage_options)
    table.index_lock = nullcontext  # this handle's commits only
    return merge_region(table, None, region, **kwargs)


def merge_region(uri, storage_options, region_id, config=None, dedup=None, up_to_generation=None):
    """Merge one region (all its pending generations, or up to a generation) and raise what made it fail:
    the library's `merge_table` for one region, as the tests call it."""
    from memwal.merge import MergeConfig, _merge_regions, local_dedup
    from memwal.region_manifest import canonical_region_id
    from memwal.table import MemWalTable

    region_id = canonical_region_id(region_id)
    table = uri if isinstance(uri, MemWalTable) else MemWalTable(uri, storage_options)
    results, errors, _ = _merge_regions(table, [region_id], config or MergeConfig(),
                                        dedup or local_dedup, up_to_generation, {})
    if region_id in errors:
        raise errors[region_id]
    return results[region_id]
