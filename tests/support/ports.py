"""Ports a test holds rather than picks: a port bound and closed again is free for any process to
take before the test uses it (bind-and-close races with everything else on the machine)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


@contextlib.contextmanager
def refusing_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A TCP port held bound and never listening for the block: every connection to it is
    refused, and no other process can take it and answer meanwhile."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        yield int(sock.getsockname()[1])
