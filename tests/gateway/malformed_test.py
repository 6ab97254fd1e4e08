"""The HTTP parser's refusals are the gateway's own answers: 400 MalformedRequest as an ErrorBody,
never aiohttp's text, which quotes the bytes it refused; and neither an answer nor a log line
ever holds the bearer token, however the `Authorization` header around it is broken.

Requests are written by hand over a real TLS connection (tests/gateway/rawhttp.py), since no HTTP
client sends malformed bytes.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kruntimes.gateway.bodies import ErrorBody
from kruntimes.gateway.server import Gateway
from kruntimes.pki.local import TlsFiles
from kruntimes.wire.headers import INVOCATION_ID as INVOCATION_HEADER
from tests.gateway.conftest import ALICE, Function, LogCapture
from tests.gateway.rawhttp import Connection

SECRET = ALICE.rsplit("-", 1)[1]  # the random part of the token
FRAGMENTS = [ALICE, *(SECRET[i : i + 8] for i in range(len(SECRET) - 7))]
ANSWER_WAIT_S = 30.0


def leaks(data: bytes | str) -> list[str]:
    """The token, or any 8 characters of its random part, in `data`."""
    text = data.decode("latin-1") if isinstance(data, bytes) else data
    return [f for f in FRAGMENTS if f in text]


def raw_request(fn: Function, authorization: bytes, *, name: bytes = b"Authorization") -> bytes:
    path = f"/v1/namespaces/default/runtimes/python/functions/{fn.uid}:invoke".encode()
    return (
        b"POST "
        + path
        + b" HTTP/1.1\r\nHost: gateway\r\n"
        + name
        + b": "
        + authorization
        + b"\r\n"
        + b"Content-Length: 2\r\nConnection: close\r\n\r\n{}"
    )


async def exchange(gateway: Gateway, tls: TlsFiles, data: bytes) -> bytes:
    """Send `data` on a new connection; everything the gateway sends until it closes it."""
    conn = await Connection.open(gateway.url, tls.ca_cert)
    try:
        await conn.send(data)
        return await conn.closed(within=ANSWER_WAIT_S)
    finally:
        await conn.close()


def check(received: bytes) -> int:
    """The answer's status (0: none); a 400 is the gateway's MalformedRequest ErrorBody."""
    leaked = bool(leaks(received))  # (the fragments themselves are not printed)
    assert not leaked, "the answer holds the token"
    if not received:
        return 0
    head, _, body = received.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"content-type: application/json" in head.lower(), head
    if status == 400:
        doc = json.loads(body)
        ErrorBody.model_validate(doc)
        if doc["reason"] == "MalformedRequest":
            assert doc["invocationId"] == "", "nothing of a refused request is echoed"
            assert INVOCATION_HEADER.lower().encode() not in head.lower()
    return status


def token_free_logs(log_capture: LogCapture, seen: int) -> None:
    leaked = sum(1 for line in log_capture.lines[seen:] if leaks(line))
    assert not leaked, f"{leaked} log lines hold the token"


MALFORMED = {
    "too-long": b"Bearer " + ALICE.encode() + b"x" * 9000,
    "nul": b"Bearer " + ALICE.encode() + b"\x00",
    "control": b"Bearer \x01" + ALICE.encode(),
    "bare-lf": b"Bearer " + ALICE.encode() + b"\nX-Other: 1",
    "bare-cr": b"Bearer " + ALICE.encode() + b"\rX-Other: 1",
    "obs-fold": b"Bearer\r\n " + ALICE.encode(),
    "high-bytes": b"Bearer " + ALICE.encode() + b"\xff\xfe",
    "del": b"Bearer \x7f" + ALICE.encode(),
}


@pytest.mark.parametrize("authorization", MALFORMED.values(), ids=MALFORMED.keys())
async def test_a_malformed_authorization_header_is_answered_without_it(
    gateway: Gateway, tls: TlsFiles, echo: Function, log_capture: LogCapture, authorization: bytes
) -> None:
    seen = len(log_capture.lines)
    status = check(await exchange(gateway, tls, raw_request(echo, authorization)))
    assert status in (400, 401), status
    token_free_logs(log_capture, seen)


@pytest.mark.parametrize(
    "data",
    [
        b"POST /healthz?" + ALICE.encode() + b"\x01 HTTP/1.1\r\nHost: g\r\n\r\n",
        b"GE T / HTTP/1.1\r\nAuthorization: Bearer " + ALICE.encode() + b"\r\n\r\n",
        b"GET / HTTP/1.1\r\nAuthori zation: Bearer " + ALICE.encode() + b"\r\n\r\n",
        b"GET / HTTP/1.1\r\nAuthorization Bearer " + ALICE.encode() + b"\r\n\r\n",
        b"GET / HTTP/9.9\r\nAuthorization: Bearer " + ALICE.encode() + b"\r\n\r\n",
        b"POST / HTTP/1.1\r\nAuthorization: Bearer " + ALICE.encode() + b"\r\nContent-Length: x\r\n\r\n",
        b"POST /healthz HTTP/1.1\r\nAuthorization: Bearer "
        + ALICE.encode()
        + b"\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
        + ALICE.encode()
        + b"\r\n",
        b"\x16\x03\x01" + ALICE.encode() + b"\r\n\r\n",
    ],
    ids=["request-line", "method", "header-name", "no-colon", "version", "length", "chunk", "binary"],
)
async def test_any_malformed_request_is_a_json_400_that_echoes_nothing(
    gateway: Gateway, tls: TlsFiles, log_capture: LogCapture, data: bytes
) -> None:
    seen = len(log_capture.lines)
    assert check(await exchange(gateway, tls, data)) in (400, 404, 405)
    token_free_logs(log_capture, seen)


# bytes that break a header value (CR and LF, which would start new headers, have their own cases)
WILD = st.one_of(
    st.binary(max_size=24),
    st.sampled_from([b"\x00", b"\x7f", b"\xff", b"\t", b" ", b":", b'"', b"\\", b"Bearer ", b"\x1b["]),
    st.integers(7900, 8300).map(lambda n: b"x" * n),  # around the parser's header line limit
).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
NAMES = st.sampled_from(
    [b"Authorization", b"authorization", b"AUTHORIZATION", b"Authorization ", b"Authoriza\x00tion"]
)


@settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(prefix=WILD, suffix=WILD, scheme=st.sampled_from([b"Bearer ", b"bearer ", b"", b"Basic "]), name=NAMES)
@example(prefix=b"", suffix=b"", scheme=b"Bearer ", name=b"Authorization")  # well formed: served
@example(prefix=b"", suffix=b"x" * 9000, scheme=b"Bearer ", name=b"Authorization")
async def test_fuzzed_authorization_headers_never_leak_the_token(
    gateway: Gateway,
    tls: TlsFiles,
    echo: Function,
    log_capture: LogCapture,
    prefix: bytes,
    suffix: bytes,
    scheme: bytes,
    name: bytes,
) -> None:
    seen = len(log_capture.lines)
    authorization = scheme + prefix + ALICE.encode() + suffix
    status = check(await exchange(gateway, tls, raw_request(echo, authorization, name=name)))
    if authorization == b"Bearer " + ALICE.encode() and name.lower() == b"authorization":
        assert status == 200
    else:
        assert status != 200 or name.strip().lower() == b"authorization", status
    assert status != 500
    token_free_logs(log_capture, seen)
