"""Ports for servers started later (scripts/ports.py): never one the kernel could hand out meanwhile."""

import socket

import ports
from ports import free_port


def test_free_port_is_below_the_ephemeral_range_and_bindable():
    low = ports._ephemeral_low()
    picked = {free_port() for _ in range(20)}
    assert all(p < low for p in picked), "an ephemeral port can be taken by any outgoing connection meanwhile"
    assert len(picked) > 1, "random, so that two runs on one machine rarely collide"
    for p in picked:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
