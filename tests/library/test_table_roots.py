"""Tables by root (memwal.table_roots): every Lance table under a directory, S3 prefix or LanceDB database,
found anew each sweep; what is not a MemWAL table is reported, not failed; an unlistable root is an error
naming it."""

from __future__ import annotations

import os
import shutil

import pytest

from memwal.probe import ProbeEntry, next_states, probe_tables
from memwal.table_roots import TableRootError, is_lance_table, list_root

from support.maintenance import build_table
from support.tables import create_base


def _root(local_location):
    """Under one root: three MemWAL tables (one built, two copied), a Lance table without MemWAL and a plain
    directory."""
    root = local_location
    build_table(root.child("t0.lance"), regions=1, generations=1)
    for name in ("t1.lance", "t2.lance"):
        shutil.copytree(f"{root.uri}/t0.lance", f"{root.uri}/{name}")
    create_base(root.child("plain_lance"))
    os.makedirs(f"{root.uri}/notes/more")
    return root


def test_a_root_with_tables_a_plain_lance_table_and_a_directory(local_location):
    root = _root(local_location)
    found = list_root(root.uri)
    assert found.tables == [f"{root.uri}/{n}" for n in ("plain_lance", "t0.lance", "t1.lance", "t2.lance")]
    assert found.other == [(f"{root.uri}/notes", "not a Lance table (no _versions/)")]
    results = {r.table_uri.rsplit("/", 1)[-1]: r for r in probe_tables([root.uri])}
    assert {n: r.status for n, r in results.items()} == {
        "t0.lance": "ok", "t1.lance": "ok", "t2.lance": "ok", "plain_lance": "not_memwal", "notes": "not_a_table"}
    assert results["t1.lance"].jobs == ["merge", "snapshot"] and results["t1.lance"].root == root.uri
    assert "without a MemWAL index" in results["plain_lance"].error
    assert results["notes"].error == f"{root.uri}/notes: not a Lance table (no _versions/)"


def test_tables_deeper_under_the_root_with_max_depth(local_location):
    root = _root(local_location)
    shutil.copytree(f"{root.uri}/t0.lance", f"{root.uri}/team/t9.lance")
    os.makedirs(f"{root.uri}/team/empty")
    assert list_root(root.uri).other == [(f"{root.uri}/notes", "not a Lance table (no _versions/)"),
                                         (f"{root.uri}/team", "not a Lance table (no _versions/)")]
    deeper = list_root(root.uri, max_depth=2)
    assert f"{root.uri}/team/t9.lance" in deeper.tables and len(deeper.tables) == 5
    assert deeper.other == [(f"{root.uri}/notes", "not a Lance table (no _versions/)"),
                            (f"{root.uri}/team/empty", "not a Lance table (no _versions/)")]


def test_a_table_added_under_the_root_is_probed_next_time_and_a_removed_one_no_more(local_location, monkeypatch):
    """The next sweep looks inside only what it did not know as a table: one LIST of the root and one of each
    new or non-table directory."""
    import memwal.table_roots as table_roots

    root = _root(local_location)
    first = probe_tables([root.uri])
    states = next_states(first)
    assert len(states) == 4, "the directory has no state: it is looked at again"
    shutil.copytree(f"{root.uri}/t0.lance", f"{root.uri}/t3.lance")
    shutil.rmtree(f"{root.uri}/t1.lance")
    listed = []
    real = table_roots._children
    monkeypatch.setattr(table_roots, "_children", lambda uri, opts: listed.append(uri) or real(uri, opts))
    second = {r.table_uri.rsplit("/", 1)[-1]: r for r in probe_tables([root.uri], states)}
    assert set(second) == {"t0.lance", "t2.lance", "t3.lance", "plain_lance", "notes"}
    assert second["t3.lance"].changed is None and second["t3.lance"].jobs == ["merge", "snapshot"]
    assert second["t0.lance"].changed is False and second["t2.lance"].changed is False
    assert sorted(listed) == sorted([root.uri, f"{root.uri}/notes", f"{root.uri}/t3.lance"])


def test_an_unlistable_root_is_an_error_naming_it_and_the_others_go_on(local_location, tmp_path):
    missing = str(tmp_path / "no_such_root")
    with pytest.raises(TableRootError, match=f"table root {missing} cannot be listed: no such directory"):
        list_root(missing)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(TableRootError, match="not a directory"):
        list_root(str(a_file))
    build_table(local_location, regions=1, generations=1)
    results = probe_tables([missing, "db://cloud/events", local_location.uri])
    assert [(r.table_uri, r.status) for r in results] == [
        (local_location.uri, "ok"), (missing, "error"), ("db://cloud/events", "error")]
    assert results[1].error == f"table root {missing} cannot be listed: no such directory"
    assert "unsupported table URI scheme 'db'" in results[2].error


def test_a_lancedb_database_is_a_root(local_location):
    """A LanceDB database keeps each table in `<name>.lance`: its MemWAL tables are probed, the others
    reported."""
    import lancedb
    import pyarrow as pa

    db = lancedb.connect(local_location.uri)
    db.create_table("plain", pa.table({"id": [1, 2]}))
    build_table(local_location.child("events.lance"), regions=1, generations=1)
    assert sorted(db.list_tables().tables) == ["events", "plain"]
    results = {r.table_uri.rsplit("/", 1)[-1]: r.status for r in probe_tables([local_location.uri])}
    assert results == {"events.lance": "ok", "plain.lance": "not_memwal"}


def test_roots_on_s3(s3_location):
    """A bucket and a prefix as roots; a bucket that does not exist is an error naming the root."""
    from memwal.storage import ObjectStore

    loc = s3_location
    bucket = loc.uri.rsplit("/", 1)[0]
    build_table(loc, regions=1, generations=1)
    ObjectStore(f"{bucket}/notes", loc.storage_options).put("readme.txt", b"x")
    found = list_root(bucket, loc.storage_options)
    assert found.tables == [loc.uri] and found.other == [(f"{bucket}/notes", "not a Lance table (no _versions/)")]
    assert is_lance_table(loc.uri, loc.storage_options) and not is_lance_table(bucket, loc.storage_options)
    assert list_root(loc.uri, loc.storage_options).tables == [loc.uri], "a table named as a root is that table"
    results = probe_tables([ProbeEntry(bucket, loc.storage_options)])
    assert [(r.table_uri, r.status, r.jobs) for r in results] == [
        (loc.uri, "ok", ["merge", "snapshot"]), (f"{bucket}/notes", "not_a_table", [])]
    from support.s3_requests import counting_proxy

    with counting_proxy(loc.storage_options["aws_endpoint"]) as proxy:
        via_proxy = {**loc.storage_options, "aws_endpoint": proxy.endpoint}
        again = probe_tables([ProbeEntry(bucket, via_proxy)], next_states(results))
    assert [r.changed for r in again] == [False, None]
    assert dict(proxy.counts) == {"LIST": 4}, "the root, the directory that is no table, the table's two"
    with pytest.raises(TableRootError, match="table root s3://no-such-bucket-memwal/lake cannot be listed: "):
        list_root("s3://no-such-bucket-memwal/lake", loc.storage_options)
