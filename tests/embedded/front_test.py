"""The pieces between the embedded dev server and everyone else, each on its own (the platform with
all of them is tests/cli/temporal_docs_test.py's):

- the front's mutual TLS: the owner's certificate gets its bytes through to the Unix socket and
  back; no certificate, or one of another CA, is refused in the handshake and never reaches it;
- its bounds: a connection over the cap is closed at accept, handshakes that never end hold only
  their own places and are cut at the handshake timeout;
- the sockets: 0600 in a 0700 directory, also at a path longer than sockaddr_un holds;
- the namespace: a user who is not root gets a user and network namespace of its own, with its
  own loopback up and the machine's out of reach;
- the UI's login: a ticket works once and only before it expires; a forged one never; sessions
  are bounded in number.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import socket
import ssl
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from kruntimes.pki import builder
from kruntimes.pki.local import FrontTls, ensure_front_tls
from kruntimes.temporal import ui_login
from kruntimes.temporal.front import (
    Bounds,
    Forwarder,
    front_context,
    unix_address,
    unix_listener,
    unix_upstream,
)
from kruntimes.workers.embedded import hidden_temporal
from tests.support.isolation import require_or_skip
from tests.support.waiting import eventually

OTHER_USER = 65534


@dataclass
class Upstream:
    """An echo server on a Unix socket, counting the connections that reached it."""

    path: Path
    reached: int = 0


@contextlib.asynccontextmanager
async def echo(path: Path) -> AsyncIterator[Upstream]:
    upstream = Upstream(path)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream.reached += 1
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(serve, sock=unix_listener(path))
    try:
        yield upstream
    finally:
        server.close()


@contextlib.asynccontextmanager
async def front(files: FrontTls, upstream: Path, bounds: Bounds) -> AsyncIterator[tuple[Forwarder, int]]:
    sock = socket.create_server(("127.0.0.1", 0))
    forwarder = Forwarder(
        sock,
        unix_upstream(upstream),
        tls=front_context(cert=files.cert, key=files.key, client_ca=files.ca_cert),
        bounds=bounds,
    )
    await forwarder.start()
    try:
        yield forwarder, int(sock.getsockname()[1])
    finally:
        await forwarder.close()


def _client(files: FrontTls, *, cert: Path | None, key: Path | None, tls12: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(files.ca_cert))
    context.set_alpn_protocols(["h2"])
    if tls12:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None and key is not None:
        context.load_cert_chain(cert, key)
    return context


async def _round_trip(port: int, context: ssl.SSLContext, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="localhost"
    )
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.readexactly(len(data)), 30)
    finally:
        writer.close()


def _rogue(directory: Path) -> tuple[Path, Path]:
    now = dt.datetime.now(dt.UTC)
    ca, ca_key = builder.build_ca(builder.name("rogue"), not_before=now, not_after=now + dt.timedelta(days=1))
    cert, key = builder.build_leaf(
        builder.name("rogue client"),
        ca_cert=ca,
        ca_key=ca_key,
        sans=[x509.DNSName("owner.kruntimes.local")],
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
        not_before=now,
        not_after=now + dt.timedelta(days=1),
    )
    (directory / "rogue.crt").write_bytes(builder.cert_pem(cert))
    (directory / "rogue.key").write_bytes(builder.key_pem(key))
    return directory / "rogue.crt", directory / "rogue.key"


async def test_only_the_owners_certificate_gets_through_the_front(tmp_path: Path) -> None:
    files = ensure_front_tls(tmp_path / "front")
    rogue_cert, rogue_key = _rogue(tmp_path)
    async with (
        echo(tmp_path / "sockets" / "frontend.sock") as upstream,
        front(files, upstream.path, Bounds()) as (
            forwarder,
            port,
        ),
    ):
        owner = _client(files, cert=files.client_cert, key=files.client_key)
        payload = os.urandom(300_000)  # more than a read and a write buffer: the flow is bounded, not cut
        assert await _round_trip(port, owner, payload) == payload
        assert upstream.reached == 1
        refused = [
            _client(files, cert=None, key=None, tls12=True),  # TLS 1.2: refused in the handshake itself
            _client(files, cert=rogue_cert, key=rogue_key, tls12=True),
            _client(files, cert=None, key=None),  # TLS 1.3: the refusal arrives at the first read
            _client(files, cert=rogue_cert, key=rogue_key),
        ]
        for context in refused:
            with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
                await _round_trip(port, context, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        assert upstream.reached == 1, "no refused connection reached the dev server"
        assert forwarder.failed_handshakes == len(refused)


async def test_connections_over_the_caps_are_closed_and_stuck_handshakes_time_out(tmp_path: Path) -> None:
    files = ensure_front_tls(tmp_path / "front")
    bounds = Bounds(max_connections=4, max_handshaking=2, handshake_timeout_s=1.0)
    async with (
        echo(tmp_path / "s" / "f.sock") as upstream,
        front(files, upstream.path, bounds) as (forwarder, port),
    ):
        owner = _client(files, cert=files.client_cert, key=files.client_key)
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]  # never say hello
        try:
            await eventually(lambda: forwarder.refused == 1, what="the third handshake refused")
            assert forwarder.handshaking == 2
            await eventually(
                lambda: forwarder.handshaking == 0 and forwarder.failed_handshakes == 2,
                within=15,
                what="the stuck handshakes cut at the timeout",
            )
            assert await _round_trip(port, owner, b"after") == b"after", "their places are free again"
        finally:
            for sock in silent:
                sock.close()
        opened = [
            await asyncio.open_connection("127.0.0.1", port, ssl=owner, server_hostname="localhost")
            for _ in range(4)
        ]
        try:
            await eventually(lambda: forwarder.open == 4, what="four connections open")
            with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError, OSError)):
                await _round_trip(port, owner, b"fifth")
            assert forwarder.refused == 2
        finally:
            for _, writer in opened:
                writer.close()


def test_the_sockets_are_their_owners_also_at_a_long_path(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "sockets"
    path = deep / "frontend.sock"
    assert len(os.fsencode(path)) > 108
    sock = unix_listener(path)
    try:
        assert stat.S_IMODE(os.stat(deep).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(unix_address(path))
            sock.accept()[0].close()
    finally:
        sock.close()


# Run in a fresh interpreter started as root, which then turns OTHER_USER: a child forked from
# pytest inherits what earlier tests left in this process, and the kernel may then refuse it a user
# namespace where a new process (as `krt up` starts the dev server's) gets one.
_AS_OTHER_USER = """
import encodings.idna, json, os, socket, sys
from pathlib import Path
from kruntimes.runtime.sandbox import syscalls
from kruntimes.workers.embedded import hidden_temporal
uid, port = int(sys.argv[1]), int(sys.argv[2])
os.setgroups([]); os.setgid(uid); os.setuid(uid)
syscalls.prctl(4, 1)  # PR_SET_DUMPABLE, as after an exec: its /proc/self files are its own
mode, why = hidden_temporal.isolate()
answer = {"mode": mode, "why": why}
try:
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    answer["machine"] = "reached"
except OSError as e:
    answer["machine"] = type(e).__name__
with socket.create_server(("127.0.0.1", 0)) as own:  # its own loopback is up
    socket.create_connection(own.getsockname(), timeout=5).close()
answer["uid_map"] = Path("/proc/self/uid_map").read_text().split()
print(json.dumps(answer))
"""


def test_a_user_who_is_not_root_gets_a_network_namespace_of_their_own(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        require_or_skip("switching to another user needs root")
    # what the dev server must not reach, nor be reached by
    with socket.create_server(("127.0.0.1", 0)) as machine:
        done = subprocess.run(
            [sys.executable, "-c", _AS_OTHER_USER, str(OTHER_USER), str(machine.getsockname()[1])],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout)
    if said.get("mode") == hidden_temporal.EXPOSED:
        require_or_skip(f"this kernel makes no user namespace for a user: {said['why']}")
    assert said == {
        "mode": hidden_temporal.USERNS,
        "why": "",
        "machine": "ConnectionRefusedError",
        "uid_map": [str(OTHER_USER), str(OTHER_USER), "1"],
    }


def test_a_login_ticket_works_once_before_it_expires_and_a_forged_one_never() -> None:
    key = ui_login.new_key()
    tickets = ui_login.Tickets(key)
    now = 1_800_000_000.0
    ticket = ui_login.mint(key, now=now)
    assert tickets.redeem(ticket, now=now + 1)
    assert not tickets.redeem(ticket, now=now + 2), "once"
    late = ui_login.mint(key, now=now)
    assert not tickets.redeem(late, now=now + ui_login.TICKET_TTL_S + 1), "expired"
    nonce, expires, mac = ui_login.mint(key, now=now).split(".")
    for forged in (
        ui_login.mint(ui_login.new_key(), now=now),  # another key
        f"{nonce}.{int(expires) + 60}.{mac}",  # a later expiry under the same mac
        f"{nonce}.{expires}.{mac[:-2]}AA",
        f"{nonce}.{expires}",
        "x" * 1000,
        f"{nonce}.{now + 10 * ui_login.TICKET_TTL_S:.0f}.{mac}",
    ):
        assert not tickets.redeem(forged, now=now + 1), forged


def test_sessions_are_random_bounded_and_end() -> None:
    sessions = ui_login.Sessions(ttl_s=3600, max_sessions=3)
    made = [sessions.new() for _ in range(4)]
    assert len(set(made)) == 4 and all(len(s) >= 40 for s in made)
    assert not sessions.valid(made[0]), "the oldest ended when a fourth began"
    assert all(sessions.valid(s) for s in made[1:])
    assert not sessions.valid("made-up") and not sessions.valid(None) and not sessions.valid("")
    short = ui_login.Sessions(ttl_s=-1)
    assert not short.valid(short.new()), "a session past its life"


def test_the_fronts_certificates_are_kept_until_due_and_made_anew_whole(tmp_path: Path) -> None:
    directory = tmp_path / "front"
    files = ensure_front_tls(directory)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert all(stat.S_IMODE(os.stat(p).st_mode) == 0o600 for p in (files.key, files.client_key))
    first = {p: p.read_bytes() for p in (files.ca_cert, files.cert, files.client_cert)}
    ensure_front_tls(directory)
    assert {p: p.read_bytes() for p in first} == first, "kept while not due"
    ensure_front_tls(directory, now=dt.datetime.now(dt.UTC) + dt.timedelta(days=340))
    renewed = {p: p.read_bytes() for p in first}
    assert all(renewed[p] != first[p] for p in first), "all made anew, the CA too"
    files.client_key.write_bytes(files.key.read_bytes())  # a start that died while writing them
    ensure_front_tls(directory)
    assert files.client_cert.read_bytes() != renewed[files.client_cert]
    context = front_context(cert=files.cert, key=files.key, client_ca=files.ca_cert)
    _client(files, cert=files.client_cert, key=files.client_key)  # the pair matches again
    assert context.verify_mode == ssl.CERT_REQUIRED


def test_krt_up_says_plainly_what_protects_the_control_plane_or_that_nothing_does() -> None:
    from kruntimes.workers.embedded.supervise import control_plane

    assert control_plane({"mode": "netns"}, isolation="uid").startswith(
        "owner only: the dev server in a network namespace"
    )
    assert "user and network namespace" in control_plane({"mode": "userns"}, isolation="uid")
    same_user = control_plane({"mode": "userns"}, isolation="same-user")
    assert same_user.endswith("but functions run as you, can read that certificate and so reach it too")
    exposed = control_plane(
        {"mode": "exposed", "why": "a network namespace: Operation not permitted"}, isolation="uid"
    )
    assert "(a network namespace: Operation not permitted)" in exposed
    assert "any local user can reach its frontend and UI on 127.0.0.1 without credentials" in exposed
