"""Version retention must not lose data or hide failures (issue 23, items 1 and 5): `delete_unverified`
deletes the files of a write not yet committed, so the tables file refuses it and a real run waits for the
MemWAL index lock; a transaction history that cannot be read fails the run instead of reading as an empty
rebase-repair window."""

from __future__ import annotations

import json

import lance
import pytest
from lance.fragment import write_fragments

from memwal.errors import MemWalError
from memwal.lock import index_lock
from memwal.merge import merge_table
from memwal.retention import RetentionConfig, repair_window, retain_versions

from support.maintenance import build_table
from support.storage_hooks import before_first
from support.tables import open_base, rows

ALL_OLD_UNVERIFIED = RetentionConfig(older_than_s=0, keep_versions=1, delete_unverified=True)


def _versions(loc) -> list[int]:
    return sorted(int(v["version"]) for v in open_base(loc).versions())


def _uncommitted_fragments(loc, ids) -> tuple[lance.LanceDataset, list]:
    """A writer's data files, written but not committed (what a merge holds inside its commit)."""
    ds = open_base(loc)
    return ds, write_fragments(rows(ids, "uncommitted"), ds.uri, schema=ds.schema)


def _data_file(fragments) -> str:
    return f"data/{fragments[0].files[0].path}"


def test_the_tables_file_refuses_delete_unverified():
    from memwal.airflow.config import TableConfig, TableConfigError, parse_tables
    from memwal.maintenance_config import RetentionConfig as Policy

    good, bad = parse_tables({"tables": {
        "on": {"uri": "/t", "retention": {"delete_unverified": True}},
        "off": {"uri": "/t", "retention": {"delete_unverified": False, "keep_versions": 3}},
    }}, "tables.yaml")
    assert bad["on"].key == "retention.delete_unverified"
    assert "not allowed in the tables file" in str(bad["on"]) and "not yet committed" in str(bad["on"])
    assert not good["off"].retention.delete_unverified and good["off"].retention.keep_versions == 3
    with pytest.raises(TableConfigError, match=r"retention\.delete_unverified"):
        TableConfig("t", "/t", retention=Policy(delete_unverified=True))


def test_delete_unverified_waits_for_a_merge_holding_the_lock(local_location):
    """A merge holds the MemWAL index lock and has written its data files, not yet committed. Retention with
    delete_unverified must wait for the lock: when it looks at the lock a second time (it saw it held), the
    merge's files are still there; the merge commits and releases; retention then runs, and the merge's
    rows read back. Before the fix retention took no lock and deleted those files: `Not found: data/...`."""
    loc = local_location
    build_table(loc, regions=1, generations=2)
    merge_table(loc.uri)
    store = loc.store()
    merge_lock = index_lock(store)
    merge_lock.lease_s = 3600.0  # no expiry (and no heartbeat) while the test holds it
    merge_lock.acquire()
    ds, fragments = _uncommitted_fragments(loc, [7000, 7001])
    before = _versions(loc)
    while_waiting: list[tuple[bool, bool]] = []

    def commit_and_release() -> None:
        while_waiting.append((store.exists(_data_file(fragments)), _versions(loc) == before))
        lance.LanceDataset.commit(ds.uri, lance.LanceOperation.Append(fragments), read_version=ds.version)
        merge_lock.release()

    with before_first("list_files", lambda p: p == merge_lock.dir, commit_and_release, nth=2) as fired:
        summary = retain_versions(loc.uri, ALL_OLD_UNVERIFIED)
    if not fired:  # retention did not wait: the merge commits after it, as it would have
        commit_and_release()
    try:
        ids = set(open_base(loc).to_table(columns=["id"])["id"].to_pylist())
    except (OSError, ValueError) as exc:  # before the fix: ArrowInvalid "Not found: .../data/...lance"
        ids = {f"read failed: {str(exc).splitlines()[0][:160]}"}
    assert {7000, 7001} <= ids, f"the merge's committed rows must read back: {sorted(map(str, ids))[:3]}"
    assert fired and while_waiting == [(True, True)], "retention must wait for the lock before removing anything"
    assert summary.versions_removed and summary.retained_versions == _versions(loc)


def test_delete_unverified_dry_run_lists_the_files_it_would_delete(local_location):
    loc = local_location
    build_table(loc, regions=1, generations=2)
    merge_table(loc.uri)
    _, fragments = _uncommitted_fragments(loc, [7000])
    before = _versions(loc)
    summary = retain_versions(loc.uri, RetentionConfig(older_than_s=0, keep_versions=1, delete_unverified=True,
                                                       dry_run=True))
    assert _versions(loc) == before and loc.store().exists(_data_file(fragments)), "a dry run deletes nothing"
    out = summary.to_dict()["unverified_files"]
    assert out["count"] == 1 and out["sample"] == [_data_file(fragments)] and out["bytes"] > 0
    plain = retain_versions(loc.uri, RetentionConfig(older_than_s=0, keep_versions=1, dry_run=True))
    assert plain.to_dict()["unverified_files"] is None, "without the opt-in no unverified file is deleted"


@pytest.mark.parametrize("error", [OSError("injected: transactions unreadable"), ValueError("injected: bad txn")])
def test_an_unreadable_transaction_history_fails_retention_naming_the_table(local_location, monkeypatch, error):
    """The rebase repair's window comes from the recent transactions: a failure to read them must fail the
    run (naming the table), never read as an empty window that lets retention remove those versions."""
    import memwal.retention as retention

    loc = local_location
    build_table(loc, regions=1, generations=2)
    merge_table(loc.uri)
    before = _versions(loc)

    def unreadable(ds, lookback):
        raise error

    monkeypatch.setattr(retention, "recent_transactions", unreadable)
    with pytest.raises(MemWalError, match="recent transactions") as info:
        repair_window(open_base(loc))
    assert open_base(loc).uri in str(info.value) and "injected" in str(info.value)
    for dry_run in (True, False):
        with pytest.raises(MemWalError, match="removes nothing"):
            retain_versions(loc.uri, RetentionConfig(older_than_s=0, keep_versions=1, dry_run=dry_run))
    assert _versions(loc) == before


def test_the_cli_dry_run_of_delete_unverified_names_the_files(local_location, capsys):
    """`memwal retention --delete-unverified --dry-run` passes the opt-in through and says what it would
    delete; nothing is deleted."""
    from memwal.cli import main

    loc = local_location
    build_table(loc, regions=1, generations=2)
    merge_table(loc.uri)
    _, fragments = _uncommitted_fragments(loc, [7000])
    argv = ["retention", loc.uri, "--older-than-s", "0", "--keep-versions", "1", "--delete-unverified", "--dry-run"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "--delete-unverified would also delete 1 files" in out and _data_file(fragments) in out
    assert main([*argv, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["delete_unverified"] and summary["unverified_files"]["count"] == 1
    assert loc.store().exists(_data_file(fragments)), "a dry run deletes nothing"
