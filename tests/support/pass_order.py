"""Test helper: force the two passes' default order (deletes first) for the tests that race the window
between our delete pass and our upsert pass (memwal.merge_commit.plan_passes would otherwise put the upserts
first on a batch whose tombstones all lie above its first generation)."""

from __future__ import annotations


def force_deletes_first(monkeypatch) -> None:
    from memwal import merge_commit

    real = merge_commit.plan_passes
    monkeypatch.setattr(merge_commit, "plan_passes",
                        lambda markers, since, winners, upserts, deletes: real(markers, since, {}, upserts, deletes))
