"""One level of the LSM view a reader and its searches read: the base table, a flushed generation or a MemTable."""

from __future__ import annotations

from dataclasses import dataclass

import lance

__all__ = ["Source"]


@dataclass(frozen=True)
class Source:
    """One level of the LSM tree: the base table (generation 0), a flushed generation (path: its directory
    name in the region, where its bloom filter lives) or a MemTable."""

    region_id: str | None
    generation: int
    dataset: lance.LanceDataset
    has_tombstone: bool
    path: str | None = None
