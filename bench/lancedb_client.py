"""LanceDB 0.40 as a search client for the benchmarks: one table opened once, its LSM queries run on one event
loop (as a long-lived client would query it: no connect or open per query)."""

from __future__ import annotations

import asyncio

import numpy as np


class LanceDbClient:
    """Table `name` of the LanceDB database at directory `root` (the table is `root/<name>.lance`)."""

    def __init__(self, root: str, name: str):
        import lancedb

        self.loop = asyncio.new_event_loop()

        async def open_table():
            return await (await lancedb.connect_async(root)).open_table(name)

        self.table = self.loop.run_until_complete(open_table())

    def vector_ids(self, q: np.ndarray, k: int, column: str = "vec", nprobes: int | None = None,
                   refine_factor: int | None = None) -> list[int]:
        """Ids of LanceDB's LSM vector query (its defaults where nprobes / refine_factor are None)."""
        query = self.table.query().nearest_to(q).column(column)
        if nprobes is not None:
            query = query.nprobes(nprobes)
        if refine_factor is not None:
            query = query.refine_factor(refine_factor)
        return self._ids(query, k)

    def text_ids(self, text: str, k: int, column: str = "text") -> list[int]:
        """Ids of LanceDB's LSM full-text query."""
        return self._ids(self.table.query().nearest_to_text(text, columns=column), k)

    def _ids(self, query, k: int) -> list[int]:
        return self.loop.run_until_complete(query.select(["id"]).limit(k).to_arrow()).column("id").to_pylist()

    def close(self) -> None:
        self.loop.close()
