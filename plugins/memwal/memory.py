"""Process memory of a merge driver: what a commit frees goes back to the OS, so the footprint follows one
commit (the byte budget), not the number of commits made. glibc only; elsewhere both calls do nothing."""

from __future__ import annotations

import ctypes
import logging
import os

import pyarrow as pa

__all__ = ["limit_malloc_arenas", "release_unused"]

log = logging.getLogger(__name__)

_M_ARENA_MAX = -8  # mallopt parameter (malloc.h)
DEFAULT_ARENAS = 2


def _load_libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 - glibc only
        libc.mallopt  # noqa: B018
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _load_libc()


def limit_malloc_arenas(arenas: int = DEFAULT_ARENAS) -> bool:
    """Cap glibc's malloc arenas (for the threads that start from now on) unless MALLOC_ARENA_MAX is set.

    glibc gives threads up to 8 arenas per core and keeps freed blocks in each, so a driver whose commits
    run on Lance's and Arrow's thread pools keeps growing by a commit's worth of freed memory per arena
    (bench/merge.py measures it). Called once by the entry points (`memwal`, the Spark jobs), before any
    Lance work; True when the cap was set.
    """
    if _LIBC is None or os.environ.get("MALLOC_ARENA_MAX"):
        return False
    ok = bool(_LIBC.mallopt(_M_ARENA_MAX, max(1, arenas)))
    log.debug("malloc arenas capped at %d: %s", arenas, ok)
    return ok


def release_unused() -> None:
    """Give freed memory back to the OS (Arrow's pool, glibc's arenas): called between a merge's commits."""
    try:
        pa.default_memory_pool().release_unused()
        if _LIBC is not None:
            _LIBC.malloc_trim(0)
    except Exception:  # only an optimisation
        pass
