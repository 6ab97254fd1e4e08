"""Ports we pick for our own listeners stay out of the kernel's ephemeral range, from which the
dev server picks its internal services' ports (and every `listen on port 0` gets one): a port both
had picked made the dev server's worker service fail to bind, and the server crash."""

from __future__ import annotations

import socket

from kruntimes.temporal.devserver import EPHEMERAL_RANGE, PICKED_FROM, free_port


def test_a_picked_port_is_free_and_below_the_ephemeral_range() -> None:
    low = int(EPHEMERAL_RANGE.read_text().split()[0])
    assert low - PICKED_FROM >= 1000, "this machine leaves room below its ephemeral range"
    ports = [free_port() for _ in range(50)]
    assert all(PICKED_FROM <= p < low for p in ports), ports
    for port in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free when picked (nothing of this test holds it)


def test_a_port_in_use_is_not_picked() -> None:
    held = []
    try:
        for _ in range(20):
            sock = socket.socket()
            sock.bind(("127.0.0.1", free_port()))
            sock.listen()
            held.append(sock)
        taken = {s.getsockname()[1] for s in held}
        assert len(taken) == len(held)
        assert not taken & {free_port() for _ in range(200)}
    finally:
        for sock in held:
            sock.close()


def test_a_process_does_not_pick_a_port_it_picked_lately() -> None:
    """Picked ports are bound later by whoever asked: 400 picks from the ~12,000 below the
    ephemeral range would name some port twice almost every time (a dev server's four ports once
    did, and it exited at start), unless the picker remembers what it handed out."""
    ports = [free_port() for _ in range(400)]
    assert len(set(ports)) == len(ports)
