"""bench/engines.py's template obeys the region spec (issue 41, item 9): each key is written to one region,
so the merged base does not depend on the order in which regions merge (its "results identical on every
engine" check compares engines that merge in different orders)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import lance

from memwal.generation import open_generation
from memwal.merge import merge_table
from memwal.region_manifest import list_regions, load_latest_manifest
from memwal.storage import ObjectStore

from support.tables import sorted_rows

REPO = Path(__file__).resolve().parents[2]


def _engines():
    spec = importlib.util.spec_from_file_location("bench_engines", REPO / "bench" / "engines.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _keys_by_region(path: str) -> dict[str, set[int]]:
    store = ObjectStore(path)
    out = {}
    for region in list_regions(store):
        out[region] = set()
        for fg in load_latest_manifest(store, region).flushed_generations:
            ds = open_generation(store, region, fg.generation, fg.path)
            out[region] |= set(ds.to_table(columns=["id"]).column("id").to_pylist())
    return out


def test_the_template_writes_each_key_to_one_region_and_merge_order_does_not_matter(tmp_path):
    engines = _engines()
    template = str(tmp_path / "template.lance")
    engines.build(template, base_rows=40, regions=2, generations=3, gen_rows=20)
    keys = _keys_by_region(template)
    assert len(keys) == 2
    a, b = sorted(keys)
    assert not keys[a] & keys[b], f"keys in both regions: {sorted(keys[a] & keys[b])[:5]}"
    finals = []
    for order in ([a, b], [b, a]):
        copy = str(tmp_path / f"{order[0]}.lance")
        shutil.copytree(template, copy)
        for region in order:
            assert not merge_table(copy, regions=[region]).failed_regions
        finals.append(sorted_rows(lance.dataset(copy).to_table(columns=["id", "name", "score"])))
    assert finals[0] == finals[1], "the merged base depends on the order the regions merged in"
