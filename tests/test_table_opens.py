"""How often one job opens its table: each count is what one `memwal` command does on a table with two
regions of three generations (one merge commit). Opens cost several requests each on S3."""

from __future__ import annotations

from maintenance import build_table
from open_counts import count_opens

from memwal import cli


def test_in_process_merge_opens_the_table_once(local_location, capsys):
    build_table(local_location, regions=2, generations=3)
    with count_opens(local_location.uri) as counts:
        assert cli.main(["merge", local_location.uri, "--json"]) == 0
    print("in-process merge:", dict(counts))
    assert dict(counts) == {"dataset": 1, "store": 1, "index": 1}, (
        "a merge opens the dataset and the store once and loads the index once: its refreshes before planning "
        "and before its commit find the version it planned on (its own commit moves it, and nothing reads it after)")


def test_status_opens_the_table_once(local_location):
    build_table(local_location, regions=2, generations=3)
    with count_opens(local_location.uri) as counts:
        assert cli.main(["status", local_location.uri, "--json"]) == 0
    print("status:", dict(counts))
    assert dict(counts) == {"dataset": 1, "store": 1, "index": 1}, "status opens and loads the table once"
