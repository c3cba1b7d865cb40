"""Ports for servers started later (scripts/ports.py): never one the kernel could hand out meanwhile."""

import socket

import ports
from ports import free_port


def test_free_port_is_below_the_ephemeral_range_and_bindable():
    low = ports._ephemeral_low()
    picked = {free_port() for _ in range(20)}
    assert all(p < low for p in picked), "an ephemeral port can be taken by any outgoing connection meanwhile"
    for p in picked:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_free_port_draws_over_the_whole_range_and_skips_a_busy_port(monkeypatch):
    """Random, so that two runs on one machine rarely collide: shown with a scripted draw (a count of
    distinct random picks would depend on what the generator happens to draw)."""
    low = ports._ephemeral_low()
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy_port = busy.getsockname()[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]  # released again: bindable
    calls: list[tuple[int, int]] = []
    script = iter([busy_port, free])

    class Scripted:
        def randint(self, a: int, b: int) -> int:
            calls.append((a, b))
            return next(script)

    monkeypatch.setattr(ports, "_pick", Scripted())
    try:
        assert free_port() == free, "the busy port was drawn first and skipped"
    finally:
        busy.close()
    assert calls == [(ports._LOWEST, low - 1)] * 2, "each draw spans the whole range below the ephemeral ports"
