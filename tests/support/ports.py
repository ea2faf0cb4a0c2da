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
