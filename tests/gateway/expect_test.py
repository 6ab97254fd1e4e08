"""`Expect` is answered by the gateway: an unknown expectation is ignored rather than quoted back
(aiohttp's own 417 answer echoes the header in plain text, past the gateway's middleware), and
`100 Continue` is sent only when the gateway is about to read the body, so a request it refuses
first — unauthenticated, too large — never invites its body. Requests are written by hand over a
real TLS connection (tests/gateway/rawhttp.py)."""

from __future__ import annotations

import json

from kruntimes.gateway.server import Gateway
from kruntimes.pki.local import TlsFiles
from tests.gateway.conftest import ALICE, BOGUS, Function
from tests.gateway.rawhttp import Connection, RawAnswer, request


def invoke_path(fn: Function) -> str:
    return f"/v1/namespaces/default/runtimes/python/functions/{fn.uid}:invoke"


async def first_answer(gateway: Gateway, tls: TlsFiles, data: bytes) -> RawAnswer:
    """The first answer the gateway sends to `data` on a new connection (an interim 100 too)."""
    conn = await Connection.open(gateway.url, tls.ca_cert)
    try:
        await conn.send(data)
        return await conn.answer()
    finally:
        await conn.close()


async def test_an_unknown_expectation_is_ignored_and_never_quoted(
    gateway: Gateway, tls: TlsFiles, echo: Function
) -> None:
    expect = {"Expect": f"999-{BOGUS}", "Connection": "close"}
    answer = await first_answer(
        gateway,
        tls,
        request(invoke_path(echo), headers={**expect, "Authorization": f"Bearer {ALICE}"}, body=b'{"a": 1}'),
    )
    assert answer.status == 200, answer
    assert json.loads(answer.body)["outputs"] == {"a": 1}
    for path in ("/nowhere", invoke_path(echo)):  # a refusal of the router, and of the gateway
        refused = await first_answer(gateway, tls, request(path, headers=expect, body=b"{}"))
        assert refused.status in (401, 404), refused
        assert refused.headers["content-type"].startswith("application/json")
        assert BOGUS.encode() not in refused.head + refused.body


async def test_100_continue_is_sent_only_for_a_body_the_gateway_will_read(
    gateway: Gateway, tls: TlsFiles, echo: Function
) -> None:
    expect = {"Expect": "100-continue", "Connection": "close"}
    path = invoke_path(echo)
    unauthenticated = request(path, headers=expect, content_length=500_000)
    answer = await first_answer(gateway, tls, unauthenticated)
    assert (answer.status, json.loads(answer.body)["reason"]) == (401, "Unauthenticated")
    too_large = request(path, headers={**expect, "Authorization": f"Bearer {ALICE}"}, content_length=10**8)
    answer = await first_answer(gateway, tls, too_large)
    assert (answer.status, json.loads(answer.body)["reason"]) == (413, "PayloadTooLarge")
    # a request the gateway takes: 100 Continue, then the body, then the answer
    conn = await Connection.open(gateway.url, tls.ca_cert)
    try:
        await conn.send(
            request(path, headers={**expect, "Authorization": f"Bearer {ALICE}"}, content_length=8)
        )
        interim = await conn.answer()
        assert interim.status == 100, interim
        await conn.send(b'{"b": 2}')
        final = await conn.answer()
        assert final.status == 200, final
        assert json.loads(final.body)["outputs"] == {"b": 2}
    finally:
        await conn.close()
