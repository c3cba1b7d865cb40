"""Create-if-absent is a CAS: of many writers racing to create one object, exactly one wins and the others get
AlreadyExistsError. The MemWAL index lock (memwal.lock) and Lance's commits rest on it; on S3 the suite's endpoint
keeps S3's guarantee (tests/support/atomic_moto.py), which plain moto does not."""

from __future__ import annotations

import threading

import pytest
from ports import free_port

from memwal.errors import AlreadyExistsError

from support import atomic_moto
from support.locations import Location, new_bucket, s3_options


def race(location: Location, writers: int, keys: int) -> dict[int, list[int]]:
    """`writers` threads create objects cas/0..keys-1 at once; returns the writers that succeeded, per key."""
    store = location.store()
    wins: dict[int, list[int]] = {k: [] for k in range(keys)}
    start = threading.Barrier(writers)
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            start.wait()
            for k in range(keys):
                try:
                    store.put_if_not_exists(f"cas/{k:03d}.json", f'{{"writer": {w}}}'.encode())
                except AlreadyExistsError:
                    continue
                wins[k].append(w)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return wins


def test_exactly_one_writer_creates_each_object(location):
    wins = race(location, writers=12, keys=25)
    assert all(len(w) == 1 for w in wins.values()), {k: w for k, w in wins.items() if len(w) != 1}
    store = location.store()
    for k, (w,) in wins.items():
        assert store.get(f"cas/{k:03d}.json") == f'{{"writer": {w}}}'.encode(), "the winner's bytes are stored"


@pytest.mark.parametrize("locked", [True, False], ids=["atomic_moto", "plain_moto_control"])
def test_the_suites_s3_endpoint_keeps_one_winner_where_plain_moto_lets_several(locked):
    """A 1 s pause between moto's If-None-Match check and its store puts every racing writer in that window:
    plain moto (the control) then stores several; the suite's endpoint still lets exactly one win."""
    env = {atomic_moto.PAUSE_ENV: "1", atomic_moto.UNLOCKED_ENV: "0" if locked else "1"}
    proc, endpoint = atomic_moto.start(free_port(), env)
    try:
        loc = Location("s3", f"s3://{new_bucket(endpoint)}/table", s3_options(endpoint))
        (winners,) = race(loc, writers=4, keys=1).values()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    if locked:
        assert len(winners) == 1, winners
    else:
        assert len(winners) > 1, f"the control: plain moto let {winners} win (the check and the store are apart)"
