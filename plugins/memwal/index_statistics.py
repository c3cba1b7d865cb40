"""Lance's statistics of an index, with or without a vector index's IVF centroids. pylance 14 puts the centroids in
by default (`LANCE_INCLUDE_VECTOR_CENTROIDS`, read at each call): 2.3 MB of JSON and 0.45 s for one
447-partition, 128-dimension IVF_PQ, paid by the first search of every snapshot, where only a rebuild of the
trained model (memwal.index_build) needs them.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import lance

__all__ = ["CENTROIDS_VARIABLE", "index_statistics"]

CENTROIDS_VARIABLE = "LANCE_INCLUDE_VECTOR_CENTROIDS"
_LOCK = threading.Lock()


def index_statistics(ds: lance.LanceDataset, name: str, centroids: bool = False) -> dict[str, Any]:
    """`ds.stats.index_stats(name)`, the IVF centroids included only when asked. Lance reads the choice from
    the process environment, so it is set there (under a lock, and only when it changes: the process keeps
    the last choice, which is also Lance's announced future default when it is "false")."""
    wanted = "true" if centroids else "false"
    with _LOCK:
        if os.environ.get(CENTROIDS_VARIABLE) != wanted:
            os.environ[CENTROIDS_VARIABLE] = wanted
        return ds.stats.index_stats(name)
