"""How often one job opens its table: each count is what one `memwal` command does on a table with two
regions of three generations (one merge commit of both regions). Opens cost several requests each on S3."""

from __future__ import annotations

import json
import uuid

import pytest

from memwal import cli

from support.maintenance import build_table, write_generations
from support.open_counts import count_opens
from support.tables import create_base, open_base


def _tombstones_in_the_first_generation(loc) -> None:
    """Two regions of three generations, each deleting a base key in its first generation (the merge's
    passes then go deletes first, `memwal.merge_commit.plan_passes`)."""
    create_base(loc, ids=range(10))
    open_base(loc).initialize_mem_wal(unsharded=True)
    for r in range(2):
        keys = 1000 * (r + 1)
        write_generations(loc, str(uuid.uuid4()), [([keys], "g1", [r]), ([keys + 1], "g2", []), ([keys + 2], "g3", [])])


@pytest.mark.parametrize(("order", "index_loads", "table_commits"), [("upserts first", 1, 3), ("deletes first", 2, 4)])
def test_in_process_merge_opens_the_table_once(local_location, capsys, order, index_loads, table_commits):
    """A merge opens the dataset and the store once and loads the index once per progress check at a version
    it did not commit itself: to plan, and (deletes first) for the upsert pass's check after its own Lance
    delete, which carries no marker and may be rebased onto another commit. Every other check (the upsert
    pass at the planned version; the delete pass and the marker-only steps right after our own marked
    commit) needs no load. build_table's tombstones lie in each region's second generation: upserts first."""
    if order == "upserts first":
        build_table(local_location, regions=2, generations=3)
    else:
        _tombstones_in_the_first_generation(local_location)
    capsys.readouterr()
    with count_opens(local_location.uri) as counts:
        assert cli.main(["merge", local_location.uri, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    print(f"in-process merge ({order}):", dict(counts))
    assert summary["table_commits"] == table_commits, f"the case's pass order ({order}): {summary}"
    assert dict(counts) == {"dataset": 1, "store": 1, "index": index_loads}, (
        f"a merge ({order}) opens the dataset and the store once and loads the index to plan"
        + (", and once more for the upsert pass's check after its own delete pass" if index_loads == 2 else ""))


def test_status_opens_the_table_once(local_location):
    build_table(local_location, regions=2, generations=3)
    with count_opens(local_location.uri) as counts:
        assert cli.main(["status", local_location.uri, "--json", "--no-health"]) == 0
    print("status:", dict(counts))
    assert dict(counts) == {"dataset": 1, "store": 1, "index": 1}, "status opens and loads the table once"


def test_status_with_health_reads_each_older_retained_version_once(local_location):
    """Health plans GC, which needs merged_generations as of every retained table version: the latest
    comes from the handle's index, each older one from its own manifest, once."""
    build_table(local_location, regions=2, generations=3)
    import lance

    versions = len(lance.dataset(local_location.uri).versions())
    assert versions > 1, "the case needs an older retained version"
    with count_opens(local_location.uri) as counts:
        assert cli.main(["status", local_location.uri, "--json"]) == 0
    print("status with health:", dict(counts))
    assert dict(counts) == {"dataset": 1, "store": 1, "index": 1 + (versions - 1)}, (
        "status loads the latest index once and reads each older retained version's entry once")
