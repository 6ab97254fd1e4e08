"""kruntimes.system.fdpass: what both call launchers take from their socket — a message with exactly
its descriptors, end of file, or a ValueError (the descriptors of a malformed one closed)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from kruntimes.system import fdpass


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        yield ours, theirs


def pipes(count: int) -> list[int]:
    fds: list[int] = []
    for _ in range(count):
        fds += os.pipe()
    return fds


def test_a_message_comes_with_its_descriptors_close_on_exec(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = pair
    r, w = os.pipe()
    try:
        socket.send_fds(ours, [b'{"op": "run"}'], [r, w, w])
        data, fds = fdpass.receive(theirs, 4096, 3)
        assert data == b'{"op": "run"}' and len(fds) == 3
        assert not any(os.get_inheritable(fd) for fd in fds)
        os.write(fds[1], b"x")
        assert os.read(r, 1) == b"x", "the descriptors are the ones sent"
        for fd in fds:
            os.close(fd)
    finally:
        os.close(r)
        os.close(w)


def test_end_of_file(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair
    ours.shutdown(socket.SHUT_WR)
    assert fdpass.receive(theirs, 4096, 3) == (b"", [])


@pytest.mark.parametrize("sent", [1, 4])
def test_another_number_of_descriptors_is_refused_and_they_are_closed(
    pair: tuple[socket.socket, socket.socket], sent: int
) -> None:
    ours, theirs = pair
    fds = pipes(2)
    before = set(os.listdir("/proc/self/fd"))
    try:
        socket.send_fds(ours, [b"{}"], fds[:sent])
        with pytest.raises(ValueError):
            fdpass.receive(theirs, 4096, 3)
        assert set(os.listdir("/proc/self/fd")) == before, "what came with it is closed"
    finally:
        for fd in fds:
            os.close(fd)


def test_a_message_cut_short_is_refused(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair
    ours.send(b"x" * 100)
    with pytest.raises(ValueError):
        fdpass.receive(theirs, 10, 3)
