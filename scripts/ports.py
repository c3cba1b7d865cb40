"""Free TCP ports on 127.0.0.1 for servers that are started later (the local Airflow, tests, benchmarks)."""

from __future__ import annotations

import random
import socket

__all__ = ["free_port"]

_LOWEST = 20000
_pick = random.SystemRandom()  # not the `random` module: hypothesis seeds it, and two suites would pick alike


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port free now that the kernel does not hand out by itself: below the ephemeral range, so neither a
    port-0 bind nor an outgoing connection (Airflow's to PostgreSQL, say) can take it in the seconds before
    its server binds it. Picked at random, so two runs on one machine rarely want the same one."""
    high = _ephemeral_low() - 1
    if high > _LOWEST:
        for _ in range(200):
            port = _pick.randint(_LOWEST, high)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:  # no room below the ephemeral range: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
