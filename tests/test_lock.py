"""The MemWAL index lock: mutual exclusion on object storage, leases, heartbeats, takeover."""

import threading
import time

from memwal.lock import TableLock


def test_only_one_holder_at_a_time(location):
    store = location.store()
    inside, overlaps, done = [], [], []

    def worker():
        for _ in range(3):
            with TableLock(store, "t", lease_s=5):
                inside.append(1)
                if len(inside) > 1:
                    overlaps.append(1)
                time.sleep(0.01)
                inside.pop()
        done.append(1)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(done) == 3 and not overlaps, "two holders were inside the lock at once"


def test_a_crashed_holder_blocks_for_one_lease_then_is_taken_over(local_location):
    store = local_location.store()
    crashed = TableLock(store, "t", lease_s=0.3)
    crashed.acquire()
    crashed._stop.set()  # the process died: no heartbeat, no release
    started = time.monotonic()
    with TableLock(store, "t", lease_s=5, wait_s=10):
        waited = time.monotonic() - started
    assert 0.2 < waited < 5, f"takeover after the lease expired, not before ({waited:.2f}s)"


def test_heartbeat_keeps_a_slow_holder_past_its_lease(local_location):
    store = local_location.store()
    with TableLock(store, "t", lease_s=0.3):
        time.sleep(1.0)  # three leases long
        other = TableLock(store, "t", lease_s=5, wait_s=0.2)
        try:
            other.acquire()
            got = True
        except Exception:
            got = False
    assert not got, "a live holder's lease must be renewed, not taken over"


def test_waiting_too_long_names_the_holder(local_location):
    import pytest

    from memwal.errors import CommitConflictError

    store = local_location.store()
    with TableLock(store, "t", lease_s=5) as holder, pytest.raises(CommitConflictError, match=holder.owner):
        TableLock(store, "t", wait_s=0.1).acquire()
