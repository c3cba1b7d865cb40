"""MemWalHook.status is `memwal status --json` of the same table (issue 34: the hook calls the status function
directly now that the table handle no longer carries the jobs)."""

from __future__ import annotations

import json

from memwal.airflow.hooks.memwal import MemWalHook
from memwal.cli import main

from support.maintenance import build_table


def test_the_hooks_status_is_the_commands_status(local_location, capsys):
    """Two regions of three unmerged generations each; the hook and the command read the same table."""
    a, b = build_table(local_location, regions=2, generations=3)
    assert main(["status", local_location.uri, "--json"]) == 0
    command = json.loads(capsys.readouterr().out)
    hook = MemWalHook(memwal_conn_id=None).status(local_location.uri)
    by_region = {r["region_id"]: r for r in hook["regions"]}
    assert set(by_region) == {a, b}, "the hook's status lists every region of the table"
    assert all(r["unmerged_generations"] == 3 for r in hook["regions"]), "three flushed generations each"
    assert [(r["region_id"], r["unmerged_generations"]) for r in command["regions"]] == [
        (r["region_id"], r["unmerged_generations"]) for r in hook["regions"]], "the command prints the same regions"
    only_a = MemWalHook(memwal_conn_id=None).status(local_location.uri, [a])
    assert [r["region_id"] for r in only_a["regions"]] == [a], "regions narrow the status as --region does"
