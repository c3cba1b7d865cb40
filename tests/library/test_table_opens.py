"""How often one job opens its table: each count is what one `memwal` command does on a table with two
regions of three generations (one merge commit: a delete pass and an upsert pass). Opens cost several
requests each on S3."""

from __future__ import annotations

from memwal import cli

from support.maintenance import build_table
from support.open_counts import count_opens


def test_in_process_merge_opens_the_table_once(local_location, capsys):
    build_table(local_location, regions=2, generations=3)
    with count_opens(local_location.uri) as counts:
        assert cli.main(["merge", local_location.uri, "--json"]) == 0
    print("in-process merge:", dict(counts))
    assert dict(counts) == {"dataset": 1, "store": 1, "index": 2}, (
        "a merge opens the dataset and the store once and loads the index once per refresh that moved the "
        "version: to plan, then for the upsert pass's progress check after its own delete pass")


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
