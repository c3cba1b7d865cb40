"""Named fault points for crash testing: with MEMWAL_FAULT=<name> set, the process kills itself with
SIGKILL when it reaches that point (MEMWAL_FAULT_SKIP=N lets the first N hits pass). Inert otherwise."""

from __future__ import annotations

import os
import signal

__all__ = ["FAULT_POINTS", "fault_point"]

FAULT_POINTS = (
    "writer.after_wal_write",  # WAL entry durable, put not yet acknowledged
    "writer.after_generation_write",  # generation directory written, manifest not yet committed
    "writer.after_manifest_commit",  # flush committed, MemTable not yet rotated
    "merge.before_commit",  # generations read and deduplicated
    "merge.between_passes",  # a commit's delete pass committed, its upsert pass (with the marker) not yet
    "merge.apply_before_commit",  # fragment apply: deletion vectors and new fragments written, Update not committed
    "merge.between_update_and_marker",  # fragment apply: Update committed, the marker commit not yet
    "merge.between_marker_steps",  # data and marker step k committed, marker-only step k+1 not yet
    "merge.after_commit",  # data + marker committed, not yet reported
    "details.after_commit",  # MemWAL index rewrite committed, not yet checked for a rebase
    "gc.after_manifest_prune",  # manifest without the generations committed, nothing deleted yet
    "gc.mid_delete",  # some GC deletions done
    "snapshot.after_external_write",  # index.lance written, details not committed
    "compaction.before_commit",  # compaction tasks executed (rewritten files written), not committed
    "compaction.after_commit",  # compaction committed, not yet reported
    "index_build.after_tasks",  # index segments built by tasks (files written), not committed
    "index_build.after_commit",  # index segments committed, index_catchup not yet recorded
)

_hits: dict[str, int] = {}


def fault_point(name: str) -> None:
    """SIGKILL this process here if MEMWAL_FAULT names this point (after MEMWAL_FAULT_SKIP hits)."""
    target = os.environ.get("MEMWAL_FAULT")
    if target != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] > int(os.environ.get("MEMWAL_FAULT_SKIP", "0")):
        os.kill(os.getpid(), signal.SIGKILL)
