"""Free localhost ports, for processes this one starts (DDP rendezvous,
TensorFlow cluster tasks, the local stack, tests and benchmarks).

A port picked here is bound by its user seconds later (a broker's JVM
starting), and in between any connection any process opens takes a local
port from the kernel's ephemeral range: a port picked from that range (as
``bind(("", 0))`` picks) can be gone by then ("Address already in use",
seen in CI with three brokers starting beside the other tests). So ports
are picked below the ephemeral range, where the kernel never hands one to a
connection, at random (two processes picking at once rarely meet)."""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

#: Where Linux keeps the range it draws connections' local ports from.
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: The lowest port picked: above the well-known and most registered ones.
LOWEST = 10_000
#: Ports tried before giving up on the range below the ephemeral one.
_TRIES = 200

_random = random.SystemRandom()


def free_ports(count: int) -> list[int]:
    """``count`` distinct localhost ports that were free a moment ago, below
    the kernel's ephemeral range where there is room (else in it).

    All sockets stay bound until every port is picked, so the ports differ;
    another process picking at the same moment may still take one before
    its user binds it."""
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for candidate in _candidates(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError:  # taken, or still in TIME_WAIT
                continue
            ports.append(int(sock.getsockname()[1]))
            if len(ports) == count:
                return ports
        raise OSError(f"no {count} free localhost ports found")


def free_port() -> int:
    """One free localhost port (see ``free_ports``)."""
    return free_ports(1)[0]


def ephemeral_range() -> tuple[int, int] | None:
    """The kernel's (low, high) range for connections' local ports; None
    where it cannot be read (not Linux)."""
    try:
        low, high = (int(part) for part in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def _candidates(count: int) -> list[int]:
    """Ports to try: random ones below the ephemeral range, then 0s (the
    kernel's choice) for whatever those did not give."""
    span = ephemeral_range()
    below = range(LOWEST, span[0]) if span is not None else range(0)
    tries = min(len(below), count + _TRIES)
    return [*_random.sample(below, tries), *[0] * count]
