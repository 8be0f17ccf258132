"""Ports for the servers a test starts, which bind them a moment (or under load, seconds) after
the pick: below the kernel's ephemeral range, so that no outgoing connection on the machine (two
test runs at once make thousands) is handed the port in between. A port from `bind(0)` is in
that range: two runs at once lost one that way, and the server never listened."""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 10_000
# What Linux uses when /proc does not say.
EPHEMERAL_LOW = 32_768
# Room above a pick, for a program that suggests the next port up (scripts/run.py).
HEADROOM = 100


def free_port() -> int:
    """A port of 127.0.0.1 free now, at random below the ephemeral range (two sessions rarely
    pick the same one)."""
    top = _ephemeral_low() - HEADROOM
    for _ in range(1000):
        port = random.randrange(LOWEST, top)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port of 127.0.0.1 between {LOWEST} and {top}")


def _ephemeral_low() -> int:
    try:
        low, _ = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return max(int(low), LOWEST + 2 * HEADROOM)
    except (OSError, ValueError):
        return EPHEMERAL_LOW
