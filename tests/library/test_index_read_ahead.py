"""memwal.index_read_ahead: an upserts-first commit looks its delete pass's keys up through the key's index
while its upsert pass runs, on the handle's own Lance session, so the delete pass finds those BTREE pages
loaded (issue 44: one merge commit at Lance's floor). A read only: the merge's result cannot depend on it."""

import logging
import threading
import uuid

import lance
import pyarrow as pa
import pytest

from memwal import index_read_ahead, merge_commit
from memwal.merge import MergeConfig

from support.maintenance import merge_region, write_generations
from support.merge_passes import exact_everywhere, lsm_view
from support.tables import open_base, rows

TWO = MergeConfig(max_generations_per_commit=2)
BASE = 40_000
DELETED = [3, 9_001, 17_777, 25_000, 39_998]


def _table(loc, index: bool = True, deleted=DELETED) -> str:
    """40,000 base rows in 4 fragments, a BTREE on the key (if `index`); gen 1 updates 5 and inserts 50,000, gen
    2 inserts 50,001 and deletes `deleted`: an upserts-first commit whose delete pass (by default 5 keys, 8,000
    rows per key) joins through the index."""
    lance.write_dataset(rows(range(BASE), "base"), loc.uri, max_rows_per_file=10_000)
    if index:
        open_base(loc).create_scalar_index("id", "BTREE")
    open_base(loc).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    write_generations(loc, region, [([5, 50_000], "g1", []), ([50_001], "g2", deleted)])
    return region


class _Events:
    """What the read-ahead and the two passes did, in order, and on which Lance session. overlap: the upsert pass
    waits (at most a minute) until the read ahead has started, so that they overlap on any machine, however
    loaded, whenever the read ahead starts before the upsert pass ends (`overlapped` says whether it did)."""

    def __init__(self, monkeypatch, overlap: bool = False):
        self.order: list[str] = []
        self.reading = threading.Event()
        self.overlapped: bool | None = None
        self.read_keys: list[int] = []
        self.sessions: dict[str, object] = {}
        self.cache_at_delete = -1
        self.lock = threading.Lock()
        real_look_up, real_delete, real_upsert = (index_read_ahead._look_up, merge_commit._delete_pass,
                                                  merge_commit._upsert_pass)

        def look_up(reader, column, keys):
            self._note("read-ahead start", reader, "reader")
            self.reading.set()
            self.read_keys = sorted(keys.to_pylist())
            real_look_up(reader, column, keys)
            self._note("read-ahead end")

        def delete_pass(pk, keys, marker):
            run = real_delete(pk, keys, marker)

            def execute(ds):
                self._note("delete pass", ds, "delete")
                self.cache_at_delete = ds.session().index_cache_size_bytes()
                return run(ds)
            return execute

        def upsert_pass(pk, upserts, compacted):
            run = real_upsert(pk, upserts, compacted)

            def execute(ds):
                self._note("upsert pass start", ds, "upsert")
                if overlap:
                    self.overlapped = self.reading.wait(60)
                out = run(ds)
                self._note("upsert pass end")
                return out
            return execute

        monkeypatch.setattr(index_read_ahead, "_look_up", look_up)
        monkeypatch.setattr(merge_commit, "_delete_pass", delete_pass)
        monkeypatch.setattr(merge_commit, "_upsert_pass", upsert_pass)

    def _note(self, what: str, ds=None, role: str | None = None) -> None:
        with self.lock:
            self.order.append(what)
            if role:
                self.sessions[role] = ds.session()


def test_the_delete_pass_keys_are_read_ahead_on_its_session_while_the_upsert_pass_runs(local_location,
                                                                                        monkeypatch):
    loc = local_location
    region = _table(loc)
    model, v0 = lsm_view(loc), open_base(loc).version
    events = _Events(monkeypatch, overlap=True)
    res = merge_region(loc.uri, None, region, TWO)
    assert res.generations == [1, 2] and res.rows_deleted == len(DELETED)
    assert events.read_keys == DELETED, "the read-ahead looked up the delete pass's keys"
    assert events.overlapped, "the read ahead did not start while the upsert pass ran"
    assert events.order.index("read-ahead start") < events.order.index("upsert pass end"), events.order
    assert events.order.index("read-ahead end") < events.order.index("delete pass"), events.order
    assert events.sessions["reader"].is_same_as(events.sessions["delete"]), \
        "the read-ahead loaded the pages into the delete pass's own Lance session"

    # what those lookups load on a session of their own: the delete pass found at least that much loaded
    alone = open_base(loc, v0)
    before = alone.session().index_cache_size_bytes()
    monkeypatch.undo()  # the real lookup, as the merge's read-ahead made it
    with index_read_ahead.keys_read_ahead(alone, "id", lance_keys(DELETED)):
        pass
    loaded = alone.session().index_cache_size_bytes() - before
    assert loaded > 0 and events.cache_at_delete >= loaded, (events.cache_at_delete, loaded)
    exact_everywhere(loc, v0, model)


def lance_keys(ids):
    return pa.array(ids, pa.int64())


@pytest.mark.parametrize("index", [True, False], ids=["many-keys", "no-index"])
def test_no_read_ahead_when_the_delete_pass_will_not_join_through_the_index(local_location, monkeypatch, index):
    """Too many keys for the index (over one per 50 rows, the rule for a table with deletion files), or no
    index on the key: nothing is read ahead, and the merge is the same."""
    loc = local_location
    region = _table(loc, index, list(range(0, BASE, 39)) if index else DELETED)  # 1,026 keys x 50 > 40,000 rows
    model, v0 = lsm_view(loc), open_base(loc).version
    events = _Events(monkeypatch)
    merge_region(loc.uri, None, region, TWO)
    assert "read-ahead start" not in events.order and "delete pass" in events.order, events.order
    exact_everywhere(loc, v0, model)


def test_a_failing_read_ahead_changes_nothing(local_location, monkeypatch, caplog):
    """The lookup raising (a store error, say) is logged at debug and the merge goes on exactly."""
    loc = local_location
    region = _table(loc)
    model, v0 = lsm_view(loc), open_base(loc).version
    calls = []

    class Broken:
        def to_table(self, **kwargs):
            calls.append(kwargs)
            raise OSError("store unreachable")

    monkeypatch.setattr(merge_commit, "_read_ahead_reader", lambda *args: Broken())
    with caplog.at_level(logging.DEBUG, logger="memwal.index_read_ahead"):
        res = merge_region(loc.uri, None, region, TWO)
    assert calls and res.rows_deleted == len(DELETED)
    assert "index read-ahead of 5 key(s) of id failed: store unreachable" in caplog.text
    exact_everywhere(loc, v0, model)


def test_a_read_ahead_that_cannot_be_opened_changes_nothing(local_location, monkeypatch):
    """Opening the version to read ahead on failing (a concurrent commit and retention removed it: "Not found"
    in a race test) leaves the merge to go on exactly, without the read ahead."""
    from memwal.table import MemWalTable

    loc = local_location
    region = _table(loc)
    model, v0 = lsm_view(loc), open_base(loc).version

    def gone(self, version=None, *, same_session=False):
        raise ValueError(f"Not found: {self.uri}/_versions/{version}.manifest")

    monkeypatch.setattr(MemWalTable, "open_dataset", gone)
    events = _Events(monkeypatch)
    res = merge_region(loc.uri, None, region, TWO)
    assert res.rows_deleted == len(DELETED) and "read-ahead start" not in events.order
    exact_everywhere(loc, v0, model)


def test_the_read_ahead_is_joined_when_the_block_raises(monkeypatch):
    """The block's error goes on only once the lookup is over: no thread outlives the commit's lock."""
    events = []

    class Thread:
        def __init__(self, target, args, name, daemon):
            self.target, self.args = target, args

        def start(self):
            events.append("start")

        def join(self):
            events.append("join")
            self.target(*self.args)

    class Reader:
        def to_table(self, **kwargs):
            events.append("looked up")

    monkeypatch.setattr(index_read_ahead.threading, "Thread", Thread)
    with (pytest.raises(RuntimeError, match="upsert pass failed"),
          index_read_ahead.keys_read_ahead(Reader(), "id", lance_keys([1, 2]))):
        events.append("block")
        raise RuntimeError("upsert pass failed")
    assert events == ["start", "block", "join", "looked up"]
    with index_read_ahead.keys_read_ahead(None, "id", lance_keys([1, 2])):
        pass
    assert events[-1] == "looked up", "no reader: nothing started"
