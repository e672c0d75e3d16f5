"""Ports for servers a test starts in another process (nginx, the fake containers).

A port from bind(("127.0.0.1", 0)) is in the kernel's ephemeral range: once released, any
outgoing connection of the busy suite may take it as its local port before the server binds
it, and two xdist workers may be handed the same one. These come from below the ephemeral
range instead, from a block of their own per worker, and are checked free when handed out.
"""

from __future__ import annotations

import itertools
import os
import socket
from pathlib import Path

BLOCK = 1000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; macOS starts at 49152


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    digits = worker[2:] if worker.startswith("gw") else ""
    return int(digits) if digits.isdigit() else 0


def _block() -> range:
    low = max(_ephemeral_low(), 12000)
    # Workers' blocks stack downwards from the ephemeral range (10000 and up, whatever n).
    start = max(10000, low - BLOCK * (_worker_index() + 1))
    return range(start, start + BLOCK)


_next = itertools.cycle(_block())


def free_port() -> int:
    """A loopback port no other worker is handed and no outgoing connection is given."""
    for _ in range(BLOCK):
        port = next(_next)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free loopback port in {_block()}")
