"""The delete pass's index pages read ahead: while a commit's upsert pass runs, a thread looks the keys the
delete pass will remove up through the key's index, on a dataset object of its own that shares the table
handle's Lance session (its index cache), so the delete pass finds the BTREE pages its keys fall in loaded.

Why: a `when_matched_delete` through the index mostly pays those pages, cold on every new handle (8M rows,
2,000 keys: 120 ms cold, 50 ms warm), and the upsert pass scans the key column meanwhile; the two overlap
(the passes' Lance work at 8M 203 -> 181 ms on an idle 2-core machine, 448 -> 413 ms with both cores busy;
bench/README.md, issue 44). A read only: it commits nothing and cannot change what either pass does; an error
is logged and forgotten (the delete pass then loads the pages itself).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import lance
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["keys_read_ahead"]

log = logging.getLogger(__name__)


@contextmanager
def keys_read_ahead(reader: lance.LanceDataset | None, column: str, keys: pa.Array) -> Iterator[None]:
    """Look `keys` of `column` up through its index on `reader` in a thread for the duration of the block
    (joined at its end, whatever the block raised). `reader` None: nothing is read. One thread: a second one
    of half the keys each halves a cold lookup on idle cores (8M rows, 2,000 keys: 121 -> 69 ms) but gains
    nothing beside the upsert pass, which keeps the other core busy."""
    if reader is None or not len(keys):
        yield
        return
    thread = threading.Thread(target=_look_up, args=(reader, column, keys), name="memwal-index-read-ahead",
                              daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def _look_up(reader: lance.LanceDataset, column: str, keys: pa.Array) -> None:
    try:
        reader.to_table(columns=[], filter=pc.field(column).isin(keys), with_row_address=True)
    except Exception as exc:  # only an optimisation: the delete pass reads what it needs itself
        log.debug("index read-ahead of %d key(s) of %s failed: %s", len(keys), column, exc)
