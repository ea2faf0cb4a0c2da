"""Free TCP ports on loopback, for the servers and Ray heads tests start (never a fixed port: other
test runs and other engineers' clusters share the machine)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on right now (the OS picks it; it may be taken again before use, which
    on loopback in a test run is rare enough)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports: each socket stays bound until all are picked (`free_port` twice in a
    row can return the same port, and a Ray node given one port for two servers fails to start)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
