"""Random paths, methods, headers and bodies against the running gateway: never a 500 (the
gateway's answer to its own bug, whatever its body), never an unexpected error inside it, every
JSON error answer a catalogued reason under its status, and it keeps answering."""

from __future__ import annotations

import io
import json
import logging
from typing import Any
from urllib.parse import quote

import aiohttp
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st
from yarl import URL

from kruntimes.api.limits import MAX_PAYLOAD_BYTES
from kruntimes.gateway.bodies import ErrorBody
from kruntimes.gateway.server import Gateway
from kruntimes.wire.headers import INVOCATION_ID as INVOCATION_HEADER
from kruntimes.wire.headers import TIMEOUT as TIMEOUT_HEADER
from kruntimes.wire.reasons import GatewayReason, gateway_reason
from tests.gateway.conftest import ALICE, BOB, BOGUS, Function, LogCapture

# mostly POST, the invoke method, so that most requests get past routing
METHODS = st.one_of(
    st.just("POST"), st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])
)

SEGMENTS = st.one_of(
    st.text(max_size=30),  # any unicode, percent-encoded below
    st.sampled_from(
        ["..", ".", "%2e%2e", "%2F", "%00", "%", "%zz", "%C0%AE", "~", "", ":invoke", "v1", "namespaces"]
    ),
    st.text(alphabet="ab%/.:;?#", max_size=12),
    st.integers(1000, 12_000).map(lambda n: "s" * n),  # huge segments (and request lines)
)


@st.composite
def paths(draw: st.DrawFn, uid: str) -> str:
    def segment() -> str:
        raw = draw(SEGMENTS)
        return quote(raw, safe=draw(st.sampled_from(["", "%", "%:", "/%.:~"])))

    kind = draw(st.sampled_from(["exact"] * 4 + ["invoke", "invoke-real", "random", "known"]))
    if kind == "exact":  # the real function, as a client would call it
        return f"/v1/namespaces/default/runtimes/python/functions/{uid}:invoke"
    if kind == "invoke":  # the invoke route with random parts
        return f"/v1/namespaces/{segment()}/runtimes/{segment()}/functions/{segment()}:invoke"
    if kind == "invoke-real":  # the real function, sometimes with extra or traversing parts
        prefix = draw(st.sampled_from(["", "/..", "/./", "/%2e%2e", "//"]))
        suffix = draw(st.sampled_from(["", "/", "/..", "?x=1", "#frag", "%00", ":invoke"]))
        namespace = draw(st.sampled_from(["default", "other", "..", "default%2F..", ""]))
        return f"{prefix}/v1/namespaces/{namespace}/runtimes/python/functions/{uid}:invoke{suffix}"
    if kind == "known":
        return draw(st.sampled_from(["/healthz", "/readyz", "/metrics", "/openapi.json", "/", "//healthz"]))
    return "/" + "/".join(segment() for _ in range(draw(st.integers(0, 6))))


def mostly(common: st.SearchStrategy[Any], *others: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`common` about half of the time, else one of `others`: most requests stay plausible."""
    return st.one_of(*[common] * len(others), *others)


AUTHORIZATION = mostly(
    st.just(f"Bearer {ALICE}"),
    st.none(),
    st.sampled_from([f"Bearer {ALICE}", f"Bearer {BOB}", f"Bearer {BOGUS}", f"bearer {ALICE}"]),
    st.sampled_from(["Bearer", "Bearer ", "Basic YWxpY2U6c2VjcmV0", f"Bearer {ALICE}x", f"Bearer  {ALICE}"]),
    st.text(max_size=60).map(lambda t: f"Bearer {t}"),
    st.text(max_size=60),
    st.integers(8000, 9000).map(lambda n: f"Bearer {ALICE}" + "x" * n),  # around the header line limit
)
INVOCATION_IDS = mostly(st.none(), st.text(max_size=140), st.integers(120, 140).map(lambda n: "i" * n))
TIMEOUTS = mostly(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["0", "0.0001", "1", "60", "3600", "-1", "1e400", "0x10", " 1 ", ""]),
    st.text(max_size=20),
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=30,
)
BODIES = mostly(
    JSON.map(lambda doc: json.dumps(doc).encode()),
    st.none(),
    st.binary(max_size=4096),
    st.sampled_from(
        [
            b"[" * 50_000,  # deep nesting
            b'{"a":' * 10_000,
            b"\xef\xbb\xbf{}",  # BOM
            b"x" * (MAX_PAYLOAD_BYTES + 1),
            b"{}" + b" " * (MAX_PAYLOAD_BYTES - 2),
        ]
    ),
)
CONTENT_TYPES = mostly(
    st.none(), st.sampled_from(["application/json", "text/plain", "multipart/form-data", "x/\u00e9"])
)


@st.composite
def requests(draw: st.DrawFn, uid: str) -> dict[str, Any]:
    headers: dict[str, str] = {}
    for name, strategy in (
        ("Authorization", AUTHORIZATION),
        (INVOCATION_HEADER, INVOCATION_IDS),
        (TIMEOUT_HEADER, TIMEOUTS),
        ("Content-Type", CONTENT_TYPES),
    ):
        value = draw(strategy)
        if value is not None:
            headers[name] = value
    return {"method": draw(METHODS), "path": draw(paths(uid)), "headers": headers, "body": draw(BODIES)}


async def _send(client: aiohttp.ClientSession, base: str, request: dict[str, Any]) -> tuple[int, bytes]:
    body = request["body"]
    try:
        url = URL(base + request["path"], encoded=True)
    except ValueError:
        reject()
    try:
        async with client.request(
            request["method"],
            url,
            headers=request["headers"],
            data=None if body is None else io.BytesIO(body),
            allow_redirects=False,
        ) as response:
            return response.status, await response.read()
    except aiohttp.ClientResponseError as exc:
        # an answer the client could not parse, e.g. aiohttp's own 400 for an oversized header sent
        # with a body even to a HEAD request: still an answer with a status
        return exc.status, b""
    except (ValueError, aiohttp.InvalidURL):
        reject()  # the client refused to send it (control characters in a header, say)


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
@given(data=st.data())
async def test_random_requests_never_get_a_500(
    gateway: Gateway,
    client: aiohttp.ClientSession,
    echo: Function,
    log_capture: LogCapture,
    data: st.DataObject,
) -> None:
    request = data.draw(requests(echo.uid))
    seen = len(log_capture.records)
    status, body = await _send(client, gateway.url, request)
    event(f"status {status}")
    # any 500, JSON or not: a bug of the gateway (an upstream's failure would be a 502)
    assert status != GatewayReason.INTERNAL_ERROR.status, (
        request["method"],
        request["path"][:200],
        body[:300],
    )
    if body.startswith(b"{"):
        try:
            doc = json.loads(body)
        except ValueError:
            doc = {}
        if isinstance(doc, dict) and "reason" in doc:
            # the gateway's error answers: an ErrorBody whose reason is catalogued under this status
            ErrorBody.model_validate(doc)
            catalogued = gateway_reason(doc["reason"])
            assert catalogued is not None, body[:300]
            assert catalogued is not GatewayReason.INTERNAL_ERROR, body[:300]
            assert catalogued.status == status, (status, body[:300])
    unexpected = [
        r
        for r in log_capture.records[seen:]
        if r.name.startswith("gateway")
        and r.levelno >= logging.ERROR
        and r.getMessage() == "unexpected error"
    ]
    assert not unexpected, unexpected[0].exc_text
    async with client.get(f"{gateway.url}/healthz") as response:
        assert response.status == 200
