"""LanceDB's LSM vector search and FTS over generations OUR writer flushed: not short, newest-wins."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import lancedb

from memwal.writer import RegionWriter, WriterConfig

from support.lancedb_peer import LanceDbTable, rows
from support.vector_model import PARTITIONS, QUERIES, WORDS, fts_ids

NEVER = WriterConfig(max_memtable_rows=10**9, max_flush_interval_s=None)


def _lsm_search(t: LanceDbTable, q=None, word: str | None = None, k: int = 100) -> list[tuple[int, str]]:
    async def go():
        db = await lancedb.connect_async(t.db.uri)
        query = (await db.open_table(t.name)).query()
        query = query.nearest_to(q).column("vec").nprobes(PARTITIONS) if word is None else \
            query.nearest_to_text(word, columns="text")
        result = await query.limit(k).to_arrow()
        return list(zip(result.column("id").to_pylist(), result.column("val").to_pylist(), strict=True))

    return asyncio.run(go())


def test_lancedb_lsm_vector_and_fts_search_see_our_generations(local_location):
    """
    base (LanceDB): ids 0..19, IVF_PQ + FTS + BTREE maintained, unsharded | our gen 1: ids 0..4 updated,
    100..104 new | our gen 2: id 5 deleted, id 100 updated again.
    LanceDB's LSM search, asked for every row, must return each live key once with its newest row.
    """
    t = LanceDbTable(local_location)
    t.create("unsharded", vector=True)
    region = str(uuid.uuid4())
    with RegionWriter(t.table.uri, region, config=NEVER) as w:
        first = rows([*range(5), *range(100, 105)], "ours", vector=True)
        w.put(first)
        w.flush()
        again = rows([100], "again", vector=True)
        w.put(again)
        w.delete(rows([5], "gone").select(["id"]))
    t._note(first)
    t._note(again)
    del t.model[5]
    live = {k: m["val"] for k, m in t.model.items()}
    for qi, q in enumerate(QUERIES):
        found = _lsm_search(t, q=q, k=len(live))
        assert len(found) == len(live), f"query {qi}: short result; a generation was planned as empty"
        assert dict(found) == live, f"query {qi}: every live key once, with its newest row"
    for word in WORDS:
        found = _lsm_search(t, word=word)
        assert sorted(k for k, _ in found) == fts_ids(live, word), f"FTS {word!r}: LanceDB's LSM FTS result"
        assert all(live[k] == v for k, v in found), f"FTS {word!r}: a stale row came back"


def test_lancedb_reads_keys_our_writer_wrote_twice_in_one_generation(local_location):
    """
    base (LanceDB): ids 0..19 | our gen 1 (one flush): ids 0..9 'one', 0..4 again 'two', id 7 deleted then put
    'three', id 8 deleted. The older rows are masked by our deletion vector: LanceDB's LSM query, vector search
    and FTS return each live key once, its newest row.
    """
    t = LanceDbTable(local_location)
    t.create("unsharded", vector=True)
    region = str(uuid.uuid4())
    batches = [rows(range(10), "one", vector=True), rows(range(5), "two", vector=True)]
    with RegionWriter(t.table.uri, region, config=NEVER) as w:
        for b in batches:
            w.put(b)
        w.delete(rows([7, 8], "gone").select(["id"]))
        again = rows([7], "three", vector=True)
        w.put(again)
    for b in (*batches, again):
        t._note(b)
    del t.model[8]
    live = {k: m["val"] for k, m in t.model.items()}
    assert list(Path(t.table.uri, "_mem_wal", region).glob("*_gen_1/_deletions/*")), "no deletion vector written"
    assert t.query() == t.expected(), "LanceDB's LSM query over a generation with masked rows"
    for qi, q in enumerate(QUERIES):
        found = _lsm_search(t, q=q, k=len(live))
        assert dict(found) == live and len(found) == len(live), f"query {qi}: a masked row or a key twice"
    for word in WORDS:
        found = _lsm_search(t, word=word)
        assert sorted(k for k, _ in found) == fts_ids(live, word), f"FTS {word!r}: LanceDB's LSM FTS result"
        assert all(live[k] == v for k, v in found), f"FTS {word!r}: a masked row came back"
