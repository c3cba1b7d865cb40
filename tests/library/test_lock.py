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


class FakeClock:
    """The wall clock leases are judged in, moved by the test: no sleeping, no dependence on load."""

    def __init__(self, now: float = 1_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_crashed_holder_blocks_for_one_lease_then_is_taken_over(local_location):
    import pytest

    from memwal.errors import CommitConflictError

    store = local_location.store()
    clock = FakeClock()
    crashed = TableLock(store, "t", lease_s=30, clock=clock)
    crashed.acquire()
    crashed._stop.set()  # the process died: no heartbeat, no release
    clock.now += 29
    with pytest.raises(CommitConflictError, match=crashed.owner):
        TableLock(store, "t", lease_s=30, wait_s=0, clock=clock).acquire()
    clock.now += 2  # one lease after the crash
    other = TableLock(store, "t", lease_s=30, wait_s=0, clock=clock).acquire()
    assert other.seq == 2, "the expired lease is taken over with the next lock object"
    other.release()


def test_heartbeat_keeps_a_slow_holder_past_its_lease(local_location):
    import pytest

    from memwal.errors import CommitConflictError

    store = local_location.store()
    clock = FakeClock()
    holder = TableLock(store, "t", lease_s=30, clock=clock).acquire()
    try:
        clock.now += 25
        assert holder.renew(), "a live holder renews its lease"
        clock.now += 15  # past the first lease, within the renewed one
        with pytest.raises(CommitConflictError, match=holder.owner):
            TableLock(store, "t", lease_s=30, wait_s=0, clock=clock).acquire()
    finally:
        holder.release()


def test_waiting_too_long_names_the_holder(local_location):
    import pytest

    from memwal.errors import CommitConflictError

    store = local_location.store()
    with TableLock(store, "t", lease_s=5) as holder, pytest.raises(CommitConflictError, match=holder.owner):
        TableLock(store, "t", wait_s=0.1).acquire()


def test_giving_up_names_the_lock_its_holder_and_the_wait(local_location):
    """A distinct LockTimeoutError (still a CommitConflictError for existing handlers) saying what to do."""
    import pytest

    from memwal.errors import CommitConflictError, LockTimeoutError

    store = local_location.store()
    holder = TableLock(store, "t", lease_s=600).acquire()
    try:
        with pytest.raises(LockTimeoutError) as caught:
            TableLock(store, "t", wait_s=0).acquire()
    finally:
        holder.release()
    exc = caught.value
    assert isinstance(exc, CommitConflictError) and exc.owner == holder.owner and exc.waited_s == 0
    assert exc.lock.endswith("_mem_wal/_locks/t") and str(exc).startswith(f"lock {exc.lock} is held by {holder.owner}")
    assert "gave up after waiting 0s" in str(exc) and "rerun" in str(exc)


def test_a_check_racing_its_own_heartbeat_keeps_the_lease(local_location):
    """Issue 41 item 6: a renew() landing between check()'s read of our sequence and its listing must not
    read as a takeover (the storage hook runs the heartbeat's renew right before check() lists)."""
    from support.storage_hooks import before_first

    store = local_location.store()
    holder = TableLock(store, "t", lease_s=600).acquire()  # the heartbeat waits 200 s: only the hook renews
    try:
        with before_first("list_files", lambda p: p.endswith("_locks/t"), holder.renew) as fired:
            holder.check()
        assert fired and holder.seq == 2, "the renew ran inside the check"
        holder.check()
    finally:
        holder.release()
