"""Free localhost ports, for processes this one starts (DDP rendezvous,
TensorFlow cluster tasks, the local stack, tests and benchmarks)."""

from __future__ import annotations

import contextlib
import socket


def free_ports(count: int) -> list[int]:
    """``count`` distinct localhost ports that were free a moment ago.

    All sockets stay bound until every port is picked, so the ports differ;
    another process may still take one before its user binds it (rare: the
    kernel hands out ephemeral ports round-robin)."""
    with contextlib.ExitStack() as stack:
        sockets = [
            stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            for _ in range(count)
        ]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def free_port() -> int:
    """One free localhost port (see ``free_ports``)."""
    return free_ports(1)[0]
