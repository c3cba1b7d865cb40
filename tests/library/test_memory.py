"""Process memory of a merge driver: glibc's arenas are capped before a job, unless the operator set it."""

import memwal.memory as memory
from memwal.cli import main

from support.maintenance import build_table


class FakeLibc:
    def __init__(self):
        self.calls = []

    def mallopt(self, param, value):
        self.calls.append(("mallopt", param, value))
        return 1

    def malloc_trim(self, pad):
        self.calls.append(("malloc_trim", pad))
        return 1


def test_arena_cap_is_set_once_before_the_job_runs(local_location, monkeypatch):
    build_table(local_location, regions=1, generations=2)
    libc = FakeLibc()
    monkeypatch.setattr(memory, "_LIBC", libc)
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert main(["merge", local_location.uri, "--max-generations-per-commit", "1"]) == 0  # two merge commits
    assert libc.calls[0] == ("mallopt", -8, memory.DEFAULT_ARENAS), "the cap comes before any commit"
    assert libc.calls[1:] == [("malloc_trim", 0)], "freed memory is given back between the commits, not after"


def test_operator_setting_wins(monkeypatch):
    libc = FakeLibc()
    monkeypatch.setattr(memory, "_LIBC", libc)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    assert memory.limit_malloc_arenas() is False
    assert libc.calls == []


def test_without_glibc_nothing_happens(monkeypatch):
    monkeypatch.setattr(memory, "_LIBC", None)
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert memory.limit_malloc_arenas() is False
    memory.release_unused()  # must not raise
