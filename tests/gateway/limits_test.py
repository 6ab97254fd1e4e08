"""The gateway's connection limits, against real gateways over real TLS sockets: slow TLS
handshakes, slow headers and slow bodies are cut at the configured time, idle kept-alive
connections are closed after the idle timeout, the connection caps refuse new connections at
accept while the open ones keep being served, and a caller that leaves is a client abort (499),
never a 5xx.

Time is driven by small configured timeouts; each test waits (bounded) for the connection to be
closed and checks that it was not closed before its timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from kruntimes.gateway.auth import CachingAuthorizer, EmbeddedAuthorizer, RoleBindings, TokenFile
from kruntimes.gateway.listener import LINGERING_S, HttpLimits, Listener
from kruntimes.gateway.metrics import GatewayMetrics
from kruntimes.gateway.server import Gateway
from kruntimes.pki.local import TlsFiles
from tests.gateway.conftest import ALICE, Function, Hosts, LogCapture, lines, recording, wait_for
from tests.gateway.rawhttp import TRICKLE_S, Connection, request, trickling
from tests.support.pki import TestPKI
from tests.support.stack import local_gateway_options

LIMITS = HttpLimits(header_timeout_s=0.5, body_timeout_s=0.5, body_min_rate=2000, idle_timeout_s=3.0)

RECORDED = """
import os
import time

def handle(payload):
    with open(os.environ["TEST_RECORD"], "a") as f:
        f.write("run\\n")
    time.sleep(payload.get("sleep", 0) if isinstance(payload, dict) else 0)
    return {"length": len(str(payload))}
"""


def sample(gw: Gateway, name: str, **labels: str) -> float:
    return gw.metrics.registry.get_sample_value(name, labels) or 0.0


def cuts(gw: Gateway, reason: str) -> float:
    return sample(gw, "krt_gateway_connections_cut_total", reason=reason)


def invoke_path(fn: Function) -> str:
    return f"/v1/namespaces/default/runtimes/python/functions/{fn.uid}:invoke"


async def start_gateway(
    tls: TlsFiles, auth_files: tuple[Path, Path], limits: HttpLimits, pki: TestPKI
) -> Gateway:
    tokens, bindings = auth_files
    gw = Gateway(
        local_gateway_options(
            tls,
            authorizer=CachingAuthorizer(EmbeddedAuthorizer(TokenFile(tokens), RoleBindings.load(bindings))),
            limits=limits,
            peer_tls=pki.gateway,
            assignments=pki.verifier(),
        )
    )
    await gw.start()
    return gw


@contextlib.asynccontextmanager
async def running(
    tls: TlsFiles, auth_files: tuple[Path, Path], limits: HttpLimits, pki: TestPKI
) -> AsyncIterator[Gateway]:
    gw = await start_gateway(tls, auth_files, limits, pki)
    try:
        yield gw
    finally:
        await gw.stop()


@pytest.fixture(scope="module")
async def limited(tls: TlsFiles, auth_files: tuple[Path, Path], pki: TestPKI) -> AsyncIterator[Gateway]:
    async with running(tls, auth_files, LIMITS, pki) as gw:
        yield gw


@pytest.fixture(scope="module")
async def limited_hosts(limited: Gateway, session_dir: Path, pki: TestPKI) -> AsyncIterator[Hosts]:
    async with Hosts(limited, session_dir, pki) as started:
        yield started


@pytest.fixture
async def recorded(limited: Gateway, limited_hosts: Hosts, records_dir: Path) -> tuple[Function, Path]:
    host = limited_hosts.started[0] if limited_hosts.started else await limited_hosts.start("gw-limits")
    path, fn = await recording(host, limited, records_dir, RECORDED)
    return fn, path


def get(path: str = "/healthz") -> bytes:
    return request(path, method="GET")


# -- headers ---------------------------------------------------------------------------------------


async def kept_alive(gw: Gateway, tls: TlsFiles) -> Connection:
    """A connection that has had one request answered (200) and is kept alive."""
    conn = await Connection.open(gw.url, tls.ca_cert)
    await conn.send(get())
    assert (await conn.answer()).status == 200
    return conn


async def test_slow_headers_are_cut_at_the_header_timeout(limited: Gateway, tls: TlsFiles) -> None:
    before = cuts(limited, "header_timeout")
    conn = await Connection.open(limited.url, tls.ca_cert)
    started = time.monotonic()
    async with trickling(conn, b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-Slow: " + b"a" * 1000):
        received = await conn.closed()
    assert time.monotonic() - started >= LIMITS.header_timeout_s
    assert received == b"", "cut, not answered"
    assert cuts(limited, "header_timeout") == before + 1


async def test_the_next_requests_slow_headers_on_a_kept_alive_connection_are_cut_too(
    limited: Gateway, tls: TlsFiles
) -> None:
    before = cuts(limited, "header_timeout")
    conn = await kept_alive(limited, tls)
    started = time.monotonic()
    async with trickling(conn, b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-Slow: " + b"a" * 1000):
        received = await conn.closed()
    assert time.monotonic() - started >= LIMITS.header_timeout_s
    assert received == b""
    assert cuts(limited, "header_timeout") == before + 1  # the header timeout, not the idle one


async def test_a_connection_that_never_completes_its_tls_handshake_is_cut(
    limited: Gateway, tls: TlsFiles
) -> None:
    before = cuts(limited, "tls_handshake")
    started = time.monotonic()  # before the gateway accepts: its timer cannot have started earlier
    conn = await Connection.open(limited.url, tls.ca_cert, tls=False)  # TCP only: no ClientHello
    try:
        assert await conn.closed() == b""
    finally:
        await conn.close()
    assert time.monotonic() - started >= LIMITS.header_timeout_s
    await wait_for(lambda: cuts(limited, "tls_handshake") == before + 1, "the handshake cut to be counted")


async def test_timely_idle_and_pipelined_requests_are_not_cut(limited: Gateway, tls: TlsFiles) -> None:
    before = cuts(limited, "header_timeout")
    idle = await kept_alive(limited, tls)
    # another connection's slow headers are cut: the header timeout has passed since `idle` was
    # answered, and `idle` is still open, since a kept-alive connection may wait the idle timeout
    slow = await Connection.open(limited.url, tls.ca_cert)
    async with trickling(slow, b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 1000):
        await slow.closed()
    assert cuts(limited, "header_timeout") == before + 1
    await idle.send(get())
    assert (await idle.answer()).status == 200
    # headers in pieces, each one in time
    data = get()
    for piece in (data[:5], data[5:20], data[20:]):
        await idle.send(piece)
    assert (await idle.answer()).status == 200
    # two requests in one write: both answered, in order
    await idle.send(get("/healthz") + get("/nowhere"))
    assert [(await idle.answer()).status, (await idle.answer()).status] == [200, 404]
    await idle.close()
    assert cuts(limited, "header_timeout") == before + 1


async def test_a_request_longer_than_the_header_timeout_is_answered_on_its_kept_alive_connection(
    limited: Gateway, tls: TlsFiles, recorded: tuple[Function, Path]
) -> None:
    """The header timeout bounds the headers only: a function that runs longer than it keeps its
    connection, which serves the next request (aiohttp's own client, one kept-alive connection)."""
    fn, path = recorded
    before = cuts(limited, "header_timeout")
    context = ssl.create_default_context(cafile=str(tls.ca_cert))
    connector = aiohttp.TCPConnector(ssl=context, limit=1)
    url = f"{limited.url}{invoke_path(fn)}"
    async with aiohttp.ClientSession(connector=connector) as http:
        for _ in range(2):
            body = {"sleep": 3 * LIMITS.header_timeout_s}
            async with http.post(url, json=body, headers={"Authorization": f"Bearer {ALICE}"}) as answer:
                assert answer.status == 200, await answer.text()
    assert lines(path) == ["run", "run"]
    assert cuts(limited, "header_timeout") == before


async def test_an_idle_kept_alive_connection_is_closed_after_the_idle_timeout(
    limited: Gateway, tls: TlsFiles
) -> None:
    before = cuts(limited, "header_timeout")
    asked = time.monotonic()  # before the request: the idle time starts after its answer
    conn = await kept_alive(limited, tls)
    assert await conn.closed() == b""
    assert time.monotonic() - asked >= LIMITS.idle_timeout_s
    assert cuts(limited, "header_timeout") == before  # closed as idle, not as slow


# -- bodies --------------------------------------------------------------------------------------


async def test_a_slow_body_is_answered_408_and_its_connection_closed(
    limited: Gateway, tls: TlsFiles, recorded: tuple[Function, Path]
) -> None:
    fn, path = recorded
    conn = await Connection.open(limited.url, tls.ca_cert)
    head = request(
        invoke_path(fn),
        headers={"Authorization": f"Bearer {ALICE}", "X-Kruntime-Invocation-ID": "inv-slow-body"},
        content_length=100_000,
    )
    await conn.send(head)
    started = time.monotonic()
    async with trickling(conn, b'"' + b"x" * 10_000):  # 20 bytes/s, under the minimum rate
        answer = await conn.answer()
        assert answer.status == 408
        assert answer.headers["content-type"].startswith("application/json")
        assert json.loads(answer.body) == {
            "reason": "RequestBodyTimeout",
            "message": json.loads(answer.body)["message"],
            "invocationId": "inv-slow-body",
        }
        assert answer.headers["connection"].lower() == "close"
        # closed at once, not after reading (and dropping) the rest of the body as an early answer
        # would for up to LINGERING_S
        assert await conn.closed(within=LINGERING_S / 2) == b""
    assert time.monotonic() - started >= LIMITS.body_timeout_s
    assert lines(path) == [], "the function never ran"


async def test_a_body_over_the_minimum_rate_is_read_whole_after_the_grace(
    limited: Gateway, tls: TlsFiles, recorded: tuple[Function, Path]
) -> None:
    fn, path = recorded
    body = json.dumps("y" * 6000).encode()  # 15 pieces of 400 bytes: about 8000 bytes/s
    conn = await Connection.open(limited.url, tls.ca_cert)
    await conn.send(
        request(invoke_path(fn), headers={"Authorization": f"Bearer {ALICE}"}, content_length=len(body))
    )
    started = time.monotonic()
    for i in range(0, len(body), 400):
        await conn.send(body[i : i + 400])
        await asyncio.sleep(TRICKLE_S)
    answer = await conn.answer()
    assert time.monotonic() - started > LIMITS.body_timeout_s  # it took longer than the grace
    assert answer.status == 200, answer.body
    assert json.loads(answer.body)["outputs"] == {"length": 6000}
    assert lines(path) == ["run"]
    await conn.close()


# -- client aborts -------------------------------------------------------------------------------


def aborts(gw: Gateway) -> float:
    return sample(
        gw, "krt_gateway_requests_total", route="invoke", status="499", reason="ClientClosedRequest"
    )


def server_errors(gw: Gateway) -> float:
    total = 0.0
    for metric in gw.metrics.registry.collect():
        for s in metric.samples:
            if s.name == "krt_gateway_requests_total" and s.labels["status"].startswith("5"):
                total += s.value
    return total


async def test_a_caller_that_leaves_mid_body_is_a_client_abort(
    limited: Gateway, tls: TlsFiles, recorded: tuple[Function, Path], log_capture: LogCapture
) -> None:
    fn, path = recorded
    before, errors, seen = aborts(limited), server_errors(limited), len(log_capture.records)
    conn = await Connection.open(limited.url, tls.ca_cert)
    head = request(
        invoke_path(fn),
        headers={"Authorization": f"Bearer {ALICE}", "X-Kruntime-Invocation-ID": "inv-left-mid-body"},
        content_length=1000,
    )
    await conn.send(head + b'"' + b"x" * 10)
    await conn.close()
    await wait_for(lambda: aborts(limited) == before + 1, "the abort to be counted")
    assert server_errors(limited) == errors
    logged = [r for r in log_capture.records[seen:] if r.name.startswith("gateway")]
    assert not [r for r in logged if r.levelno >= logging.WARNING], [r.getMessage() for r in logged]
    (record,) = [r for r in logged if getattr(r, "invocation_id", "") == "inv-left-mid-body"]
    assert (record.levelno, record.getMessage(), record.__dict__["status"]) == (logging.INFO, "invoke", 499)
    assert record.__dict__["reason"] == "ClientClosedRequest"
    assert lines(path) == []


async def test_a_caller_that_leaves_while_its_function_runs_is_a_client_abort(
    limited: Gateway, tls: TlsFiles, recorded: tuple[Function, Path]
) -> None:
    fn, path = recorded
    before, errors = aborts(limited), server_errors(limited)
    conn = await Connection.open(limited.url, tls.ca_cert)
    await conn.send(
        request(invoke_path(fn), headers={"Authorization": f"Bearer {ALICE}"}, body=b'{"sleep": 1}')
    )
    await wait_for(lambda: lines(path) == ["run"], "the function to start")
    await conn.close()
    await wait_for(lambda: aborts(limited) == before + 1, "the abort to be counted")
    assert server_errors(limited) == errors
    assert lines(path) == ["run"], "it ran once, and nothing retried it"


# -- connection caps -----------------------------------------------------------------------------


def refused(gw: Gateway, limit: str) -> float:
    return sample(gw, "krt_gateway_connections_refused_total", limit=limit)


async def served(conn: Connection) -> int:
    await conn.send(get())
    return (await conn.answer()).status


async def refused_at_accept(gw: Gateway, tls: TlsFiles) -> None:
    """A new connection gets no TLS session: closed at accept."""
    with pytest.raises((ConnectionError, ssl.SSLError, asyncio.IncompleteReadError)):
        conn = await Connection.open(gw.url, tls.ca_cert)
        await served(conn)  # (reached only if the handshake had succeeded)


@pytest.mark.parametrize(
    ("limits", "limit"),
    [
        (HttpLimits(max_connections=3, max_connections_per_client=3), "total"),
        (HttpLimits(max_connections=10, max_connections_per_client=3), "per_client"),
    ],
    ids=["total", "per-client"],
)
async def test_a_cap_refuses_new_connections_and_keeps_serving_the_open_ones(
    tls: TlsFiles, auth_files: tuple[Path, Path], limits: HttpLimits, limit: str, pki: TestPKI
) -> None:
    async with running(tls, auth_files, limits, pki) as gw:
        assert gw.listener is not None
        listener = gw.listener
        held = [await Connection.open(gw.url, tls.ca_cert) for _ in range(3)]
        assert [await served(c) for c in held] == [200, 200, 200]
        await refused_at_accept(gw, tls)
        await refused_at_accept(gw, tls)
        assert refused(gw, limit) == 2
        assert sample(gw, "krt_gateway_connections") == 3
        # the open ones are served as before, on their kept-alive connections
        assert [await served(c) for c in held] == [200, 200, 200]
        # one closes: its place is free again
        await held.pop().close()
        await wait_for(lambda: listener.open == 2, "the closed connection's place to be freed")
        held.append(await Connection.open(gw.url, tls.ca_cert))
        assert [await served(c) for c in held] == [200, 200, 200]
        for conn in held:
            await conn.close()
        await wait_for(lambda: listener.open == 0, "every place to be freed")
        assert refused(gw, limit) == 2


def test_the_per_client_cap_counts_each_address_apart() -> None:
    listener = Listener(
        host="127.0.0.1",
        port=0,
        ssl_context=None,
        limits=HttpLimits(max_connections=4, max_connections_per_client=2),
        metrics=GatewayMetrics(),
    )
    listener.open, listener.per_client["192.0.2.1"] = 2, 2
    assert listener._refusal("192.0.2.1") == "per_client"
    assert listener._refusal("192.0.2.2") == ""
    listener.open, listener.per_client["192.0.2.2"] = 4, 2
    assert listener._refusal("192.0.2.3") == "total"


@pytest.mark.parametrize(
    "bad",
    [
        {"header_timeout_s": 0},
        {"body_timeout_s": -1},
        {"idle_timeout_s": 1e9},
        {"body_min_rate": 0},
        {"max_connections": 0},
        {"max_connections": 10, "max_connections_per_client": 11},
    ],
    ids=repr,
)
def test_limits_out_of_bounds_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        HttpLimits(**bad)  # type: ignore[arg-type]
