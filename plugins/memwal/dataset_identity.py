"""What tells one version of a Lance dataset from any other, for caches that outlive a reader or a job.

A URI and a version number are not enough: a table removed and recreated at the same URI reaches the same
version numbers with other rows. Each version's manifest carries its commit time (ns), which a recreated
table does not repeat; caches key by (URI, version, that time).
"""

from __future__ import annotations

import lance

__all__ = ["cache_key", "content_id"]


def content_id(ds: lance.LanceDataset) -> int:
    """The commit timestamp (ns) of the dataset's current version's manifest; 0 when pylance does not say."""
    try:
        return int(ds._ds.current_version()["timestamp"])
    except (AttributeError, KeyError, TypeError, ValueError):
        return 0


def cache_key(ds: lance.LanceDataset) -> tuple[str, int, int] | None:
    """(uri, version, content_id) of the dataset's current version; None when its content cannot be told
    apart (then nothing of it may be cached beyond one reader)."""
    content = content_id(ds)
    return (ds.uri, ds.version, content) if content else None
