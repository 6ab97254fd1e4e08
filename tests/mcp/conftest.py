"""`krt mcp` against the shared embedded platform (tests/conftest.py's `session_platform`), with
the official MCP SDK's client: over stdio (a `krt mcp` subprocess, the CLI's credentials) and over
streamable HTTPS (`krt mcp --listen`, with the gateway's own token file, to which this fixture adds
its users, and role bindings of its own: an invocation carries the caller's token on to the
gateway, which binds `devs` to every namespace and no other group)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from tests.sdk.stack import Platform
from tests.support.waiting import eventually

ADMIN_TOKEN = "krt-mcp-test-admin"  # the MCP admin, and a `devs` member: the gateway lets it invoke
CAROL_TOKEN = "krt-mcp-test-carol"  # bound to namespace team-b only here; the gateway binds her nowhere
DAVE_TOKEN = "krt-mcp-test-dave"  # bound to namespace team-d only
BINDINGS = """\
bindings:
  - namespace: "*"
    groups: [admins]
  - namespace: team-b
    users: [carol]
  - namespace: team-d
    users: [dave]
"""


@contextlib.asynccontextmanager
async def stdio_session(
    platform: Platform, errlog: Path, *, identity: str | None = None
) -> AsyncIterator[ClientSession]:
    """A `krt mcp` over stdio with the platform's client config (KRT_STATE_DIR; `identity`:
    KRT_IDENTITY), and a client session with it."""
    env = platform.env() | ({"KRT_IDENTITY": identity} if identity else {})
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "kruntimes.workers.krt", "mcp"], env=env
    )
    with errlog.open("a") as err:
        async with stdio_client(params, errlog=err) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session


@dataclass
class HttpServer:
    url: str
    ca: Path
    log: Path

    @contextlib.asynccontextmanager
    async def session(self, token: str | None) -> AsyncIterator[ClientSession]:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        verify = ssl.create_default_context(cafile=str(self.ca))
        async with (
            httpx2.AsyncClient(headers=headers, verify=verify, timeout=httpx2.Timeout(60.0)) as http,
            streamable_http_client(self.url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


@pytest.fixture(scope="session")
async def mcp_http(
    session_platform: Platform, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[HttpServer]:
    """`krt mcp --listen 127.0.0.1:0` serving the gateway's certificate, with the gateway's token
    file (an admin and two users each bound here to one namespace added to it, and taken out again
    at the end: the gateway reloads it) and bindings of its own; one for every test module of this
    folder."""
    root = tmp_path_factory.mktemp("mcp")
    tokens = session_platform.state_dir.parent / "tokens.csv"  # the gateway's (tests/support/stack.py)
    before = tokens.read_text()
    with tokens.open("a") as out:
        out.write(
            f'{ADMIN_TOKEN},root,0,"admins,devs"\n{CAROL_TOKEN},carol,2001,"others"\n'
            f'{DAVE_TOKEN},dave,2002,"others"\n'
        )
    try:
        await gateway_knows(session_platform, ADMIN_TOKEN)
        bindings = root / "rolebindings.yaml"
        bindings.write_text(BINDINGS)
        auth = ["--token-file", str(tokens), "--role-bindings", str(bindings)]
        async with krt_mcp_listen(session_platform, root, auth) as server:
            yield server
    finally:
        tokens.write_text(before)


@contextlib.asynccontextmanager
async def krt_mcp_listen(platform: Platform, root: Path, auth: list[str]) -> AsyncIterator[HttpServer]:
    """`krt mcp --listen 127.0.0.1:0` with the platform's client config, its certificate and the
    auth flags `auth`, writing its log under `root`; stopped (by its pid) on exit."""
    ready = root / "ready.json"
    log = root / "mcp.log"
    tls = platform.tls
    with log.open("w") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "kruntimes.workers.krt",
            "mcp",
            "--listen",
            "127.0.0.1:0",
            "--cert",
            str(tls.cert),
            "--key",
            str(tls.key),
            *auth,
            "--ready-file",
            str(ready),
            "--log-level",
            "info",
            env=platform.env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    try:

        def url() -> str:
            assert proc.returncode is None, log.read_text()
            return str(json.loads(ready.read_text())["url"])

        yield HttpServer(
            await eventually(url, within=60, ignoring=(OSError, ValueError), what="krt mcp serving"),
            tls.ca_cert,
            log,
        )
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def gateway_knows(platform: Platform, token: str) -> None:
    """Wait until the gateway has read `token` from its token file (it looks again at most once a
    second): it answers an invocation of no Function with that token otherwise than 401."""
    url = f"{platform.config.gatewayUrl}/v1/namespaces/default/functions/{uuid.uuid4()}:invoke"
    verify = ssl.create_default_context(cafile=str(platform.tls.ca_cert))

    async def known() -> int:
        async with httpx2.AsyncClient(verify=verify) as http:
            answer = await http.post(url, headers={"Authorization": f"Bearer {token}"}, json={})
        assert answer.status_code != 401, answer.text
        return answer.status_code

    await eventually(known, within=30, ignoring=(AssertionError,), what="the gateway reading its token file")


def structured(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    return dict(result.structured_content)


def refusal(result: Any) -> dict[str, Any]:
    assert result.is_error, result.structured_content
    return dict(result.structured_content)
