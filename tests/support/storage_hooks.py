"""Storage hooks: run another party's step at an exact moment of an object-store access, so a race
test forces its interleaving deterministically instead of hoping a timing produces it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from memwal.storage import ObjectStore


@contextmanager
def before_first(method: str, matches: Callable[[str], bool], action: Callable[[], None],
                 nth: int = 1) -> Iterator[list[str]]:
    """Run `action` once, right before the first (or the `nth`) `ObjectStore.<method>(path, ...)` (any store
    instance) whose path matches. Yields a list that receives the path the hook fired on (empty if it never
    fired)."""
    original = getattr(ObjectStore, method)
    fired: list[str] = []
    seen = [0]

    def hooked(self: ObjectStore, path: str, *args: object, **kwargs: object) -> object:
        if not fired and matches(path):
            seen[0] += 1
            if seen[0] == nth:
                fired.append(path)  # first: the action's own storage calls must not fire it again
                action()
        return original(self, path, *args, **kwargs)

    setattr(ObjectStore, method, hooked)
    try:
        yield fired
    finally:
        setattr(ObjectStore, method, original)
