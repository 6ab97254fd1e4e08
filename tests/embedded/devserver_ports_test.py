"""The dev server's ports are held from the moment they are picked until it serves on them, so no
other process can take one in between; a port it was given that is taken anyway (the server
cannot pick its own) makes it start again on fresh ones."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from kruntimes.temporal.devserver import DevServer, held_port


def test_a_held_port_is_nobody_elses_but_its_server_can_listen_on_it() -> None:
    port, held = held_port()
    with held:
        with socket.socket() as other, pytest.raises(OSError, match="in use"):
            other.bind(("127.0.0.1", port))
        with socket.socket() as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen()
            with socket.create_connection(("127.0.0.1", port), timeout=10):
                pass


class FirstPickTaken(DevServer):
    """A dev server whose first picked port is one another process listens on."""

    taken: socket.socket | None = None

    def pick_port(self) -> tuple[int, socket.socket]:
        if self.taken is not None and not getattr(self, "_gave_taken", False):
            self._gave_taken = True
            return int(self.taken.getsockname()[1]), socket.socket()  # held by nothing of ours
        return super().pick_port()


async def test_a_dev_server_given_a_taken_port_starts_again_on_fresh_ones(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = FirstPickTaken(state_dir=tmp_path / "temporal", persistent=False)
        server.taken = taken
        await asyncio.to_thread(server.start)
        try:
            assert server.port != taken.getsockname()[1]
            log = (tmp_path / "temporal" / "temporal.log").read_bytes()
            assert b"address already in use" in log, "the first start met the taken port"
            with socket.create_connection(("127.0.0.1", server.port), timeout=10):
                pass
            assert server._held == {}, "its ports are let go once it serves on them"
        finally:
            server.stop()
