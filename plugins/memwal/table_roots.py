"""Tables by root: the Lance tables under a directory, an S3 prefix or a LanceDB database (whose tables are
its `<name>.lance` directories), found anew on every sweep so that a table created under the root is picked
up and a removed one is no longer probed.

A directory is a Lance table when it holds `_versions/`; whether it is a MemWAL table is the probe's to say
(it reads the manifest: `memwal.probe`). A directory that is not a table and holds none (down to
`max_depth`) is reported, not failed. Cost: one LIST (with a delimiter) of the root, and one of each child
not already known as a table (`known`: the previous sweep's tables). A root that cannot be listed (missing,
not a directory, no such bucket, refused) is a `TableRootError` naming it.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from memwal.errors import BadInputError, one_line
from memwal.storage import ObjectStore, join_uri

__all__ = ["RootListing", "TableRootError", "is_lance_table", "list_root"]

VERSIONS_DIR = "_versions"


class TableRootError(BadInputError):
    """A table root could not be listed. Check that it exists and the storage options (endpoint, bucket,
    credentials) reach it."""

    def __init__(self, root: str, problem: str):
        super().__init__(f"table root {root} cannot be listed: {problem}")
        self.root = root


@dataclass
class RootListing:
    """What is under a root: the Lance tables' URIs, and each directory that is not a table with why."""

    root: str
    tables: list[str] = field(default_factory=list)
    other: list[tuple[str, str]] = field(default_factory=list)


def _children(uri: str, storage_options: Mapping[str, str] | None) -> list[str]:
    """The immediate sub-directory names of uri (one LIST with a delimiter)."""
    return ObjectStore(uri, dict(storage_options or {}) or None).list_dirs("")


def is_lance_table(uri: str, storage_options: Mapping[str, str] | None = None) -> bool:
    """Whether uri holds a Lance table (`_versions/`): one LIST with a delimiter."""
    try:
        return VERSIONS_DIR in _children(uri, storage_options)
    except FileNotFoundError:
        return False


def list_root(root: str, storage_options: Mapping[str, str] | None = None, *, known: Collection[str] = (),
              max_depth: int = 1, max_workers: int = 16) -> RootListing:
    """The Lance tables under root, down to `max_depth` directory levels (1: its children, the layout of a
    LanceDB database), and the directories that are none. `known` URIs (normalized, as the listing gives
    them) are taken as tables without a look inside. A root that is itself a Lance table lists as that one
    table. TableRootError naming the root if it cannot be listed."""
    store = ObjectStore(root, dict(storage_options or {}) or None)
    out = RootListing(store.uri)
    local = store.local_path("")
    local = None if local is None else os.path.normpath(local)
    if local is not None and not os.path.isdir(local):
        raise TableRootError(store.uri, "no such directory" if not os.path.exists(local) else "not a directory")
    try:
        names = _children(store.uri, storage_options)
    except Exception as exc:  # obstore's errors (no such bucket, access denied) are not OSError
        raise TableRootError(store.uri, one_line(exc)) from exc
    if VERSIONS_DIR in names:
        out.tables.append(store.uri)  # the root is itself a table
        return out
    known = set(known)
    with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
        _walk(pool, out, [join_uri(store.uri, n) for n in names], storage_options, known, max_depth, 1)
    out.tables.sort()
    out.other.sort()
    return out


def _walk(pool: ThreadPoolExecutor, out: RootListing, uris: list[str], storage_options: Mapping[str, str] | None,
          known: set[str], max_depth: int, depth: int) -> None:
    """Sort uris into tables and other directories, descending into the others while depth < max_depth; a
    directory with no table below it is reported once, as itself."""
    unknown = [u for u in uris if u not in known]
    out.tables += [u for u in uris if u in known]
    for uri, children in zip(unknown, pool.map(lambda u: _safe_children(u, storage_options), unknown), strict=True):
        if isinstance(children, str):
            out.other.append((uri, f"cannot be listed: {children}"))
            continue
        if VERSIONS_DIR in children:
            out.tables.append(uri)
            continue
        below = RootListing(uri)
        if depth < max_depth:
            _walk(pool, below, [join_uri(uri, n) for n in children], storage_options, known, max_depth, depth + 1)
        if below.tables:
            out.tables += below.tables
            out.other += below.other
        else:
            out.other.append((uri, "not a Lance table (no _versions/)"))


def _safe_children(uri: str, storage_options: Mapping[str, str] | None) -> list[str] | str:
    """The children of one directory under the root, or why it could not be listed (reported, not raised)."""
    try:
        return _children(uri, storage_options)
    except Exception as exc:  # one unreadable directory under the root does not stop the others
        return one_line(exc)
