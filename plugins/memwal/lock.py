"""The MemWAL index lock: our merges and our MemWAL index rewrites never commit at the same time.

Why: Lance rebases a CreateIndex rewrite (snapshot refresh, catch-up) over a concurrent merge without a
conflict, leaving merged_generations regressed until commit_details repairs it; a stale merge committing
in that window passes Lance's marker check against the regressed value and writes older rows over newer
ones. Holding this lock around every merge commit and every rewrite (read, commit, verify) means a rewrite
is never rebased over one of our merges. Merges by other tools are not covered here; merge progress is
safe against them anyway (docs/safety-merge.md).

How: lock objects `_mem_wal/_locks/{name}/{seq}.json`, each created with put-if-not-exists (the CAS).
The newest object says who holds the lock and until when (a lease), or that it was released. To acquire,
create seq+1 when the newest is released or its lease expired; otherwise wait. While held, a heartbeat
renews the lease by creating the next object (same owner); release creates the next one as released.
An expired lease may be taken over, so a crashed holder blocks others for one lease (default 60 s,
MEMWAL_LOCK_LEASE_S) at most, while a slow but live holder keeps the lock.

Fencing: a holder that stalled past its lease may have lost the lock without knowing it. Every commit made
under the lock calls `check()` first (through `MemWalTable.check_lease`): the newest lock object must still
be ours, held and unexpired by the lock's clock, else `LeaseLostError` and no commit. The check narrows the
window to one object-store round trip; it is not what keeps merge progress safe (a merger that takes no
lock at all is refused by Lance's marker check: memwal.merge_commit).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from memwal import naming
from memwal.errors import AlreadyExistsError, LeaseLostError, LockTimeoutError, ObjectStoreError
from memwal.storage import ObjectStore

__all__ = ["LOCK_DIR", "TableLock", "index_lock"]

log = logging.getLogger(__name__)

LOCK_DIR = f"{naming.MEM_WAL_DIR}/_locks"
_WIDTH = 20


@dataclass(frozen=True)
class _State:
    seq: int
    owner: str
    released: bool
    expires_at: float


class TableLock:
    """A lease-based mutex on object storage. Use as a context manager."""

    def __init__(self, store: ObjectStore, name: str, lease_s: float | None = None, wait_s: float = 900.0,
                 clock: Callable[[], float] = time.time):
        """`clock` is the wall clock leases are written and judged in (shared by every process; tests pass
        their own to decide deterministically when a lease has expired)."""
        self.store = store
        self.clock = clock
        self.dir = f"{LOCK_DIR}/{name}"
        self.lease_s = lease_s if lease_s is not None else float(os.environ.get("MEMWAL_LOCK_LEASE_S", "60"))
        self.wait_s = wait_s
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.seq: int | None = None
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def _path(self, seq: int) -> str:
        return f"{self.dir}/{seq:0{_WIDTH}d}.json"

    def _latest(self) -> _State | None:
        seqs = sorted(int(m.path.rsplit("/", 1)[-1].split(".")[0]) for m in self.store.list_files(self.dir)
                      if m.path.endswith(".json"))
        for seq in reversed(seqs):
            try:
                d = json.loads(self.store.get(self._path(seq)))
            except FileNotFoundError:
                continue  # cleaned up meanwhile
            except ValueError:
                return _State(seq, "unreadable", True, 0.0)  # a torn write cannot hold the lock
            return _State(seq, d.get("owner", "?"), d.get("state") == "released", float(d.get("expires_at", 0)))
        return None

    def _create(self, seq: int, state: str) -> None:
        body = {"owner": self.owner, "state": state, "expires_at": self.clock() + self.lease_s}
        self.store.put_if_not_exists(self._path(seq), json.dumps(body).encode())

    def acquire(self) -> TableLock:
        deadline = time.monotonic() + self.wait_s
        delay = 0.02
        while True:
            latest = self._latest()
            if latest is None or latest.released or latest.expires_at < self.clock():
                if latest is not None and not latest.released:
                    log.warning("lock %s: lease of %s expired; taking over", self.dir, latest.owner)
                seq = (latest.seq if latest else 0) + 1
                try:
                    self._create(seq, "held")
                except AlreadyExistsError:
                    continue  # another process got there first
                self.seq = seq
                self._stop.clear()
                self._heartbeat = threading.Thread(target=self._renew, name=f"lease {self.dir}", daemon=True)
                self._heartbeat.start()
                return self
            if time.monotonic() > deadline:
                raise LockTimeoutError(f"{self.store.uri}/{self.dir}", latest.owner, self.wait_s)
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            if not self.renew():
                return

    def renew(self) -> bool:
        """Extend the lease now (the heartbeat does this every lease/3); False once it was taken over."""
        with self._mutex:
            if self.seq is None:
                return False
            try:
                if self._create_next("held"):
                    return True
                log.error("lock %s: lease %d was taken over while held (stalled past %.0fs)",
                          self.dir, self.seq, self.lease_s)
                return False
            except (OSError, ObjectStoreError) as exc:  # a store fault left after the retries: the next beat retries
                log.warning("lock %s: could not renew the lease: %s", self.dir, exc)
            return True

    def _create_next(self, state: str) -> bool:
        """Create our next lock object; False if another owner's object holds that sequence. A create left in
        doubt (its answer and read-back failed, so `seq` did not move) left an object with our owner id: step
        past it. Call with the mutex held."""
        assert self.seq is not None
        while True:
            try:
                self._create(self.seq + 1, state)
                self.seq += 1
                return True
            except AlreadyExistsError:
                if self._owner_at(self.seq + 1) != self.owner:
                    return False
                self.seq += 1

    def _owner_at(self, seq: int) -> str | None:
        try:
            return json.loads(self.store.get(self._path(seq))).get("owner")
        except (FileNotFoundError, ValueError, AttributeError):
            return None

    def check(self) -> None:
        """Raise LeaseLostError unless this lock is held by us right now: the newest lock object is ours,
        held, and its lease has not expired (a commit must not follow a lease that was lost).

        Our heartbeat may renew (create our next object) while the listing runs, so the newest object may
        be one past the sequence read before it: any of ours from that sequence on is still our lease."""
        with self._mutex:
            seq = self.seq
        where = f"{self.store.uri}/{self.dir}"
        if seq is None:
            raise LeaseLostError(where, self.owner, "is not held")
        latest = self._latest()
        if latest is None or latest.seq < seq or latest.owner != self.owner or latest.released:
            taker = latest.owner if latest is not None else "nobody"
            raise LeaseLostError(where, self.owner, f"was taken over (newest lock object: {taker})")
        if latest.expires_at < self.clock():
            raise LeaseLostError(where, self.owner, "expired before it was renewed")

    def release(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
            self._heartbeat = None
        with self._mutex:
            if self.seq is None:
                return
            if not self._create_next("released"):
                log.warning("lock %s: our lease %d was taken over before release", self.dir, self.seq)
            self.seq = None

    def __enter__(self) -> TableLock:
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()


def index_lock(store: ObjectStore) -> TableLock:
    """The lock around commits that change the MemWAL index (merges and rewrites)."""
    return TableLock(store, "mem_wal_index")
