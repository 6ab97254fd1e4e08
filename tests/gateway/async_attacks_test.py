"""Async invocations attacked from outside (issue #44), over real HTTPS against the real gateway,
Temporal dev server and worker of the shared platform: what a caller who may not `get` a target,
a caller who names another target's invocation, and a careless caller (ids that play with the
path, odd `Prefer` headers, bodies too large, too slow or not JSON, forged `continue` tokens,
limits at their edges) are answered. Never a status, a result or whether an id exists to a caller
who may not see it; never another target's invocation through a target's URL; nothing recorded
for what is refused; one body per id however many race."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from kruntimes.api.function import Function
from kruntimes.api.run import Run
from kruntimes.gateway.async_invoke import AsyncInvocations
from kruntimes.gateway.auth import Authorizer, Forbidden, Principal, Resource
from kruntimes.gateway.listener import HttpLimits
from kruntimes.sdk.client import Client, RunObject
from kruntimes.wire import headers
from tests.gateway.async_accept_test import COUNTING, TERMINAL, call, recorded, urls
from tests.gateway.rawhttp import Connection, request
from tests.sdk.stack import OTHER_TOKEN, TOKEN, Platform, manifest, unique
from tests.support.waiting import eventually

ASYNC = {headers.PREFER: "respond-async"}


@pytest.fixture
async def http(platform: Platform) -> AsyncIterator[aiohttp.ClientSession]:
    context = ssl.create_default_context(cafile=str(platform.tls.ca_cert))
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=context), timeout=aiohttp.ClientTimeout(total=60)
    ) as session:
        yield session


@pytest.fixture
def invocations(platform: Platform) -> AsyncInvocations:
    found = platform.gateway.async_invocations
    assert found is not None
    return found


async def _runs(
    platform: Platform, *names: str, source: str = COUNTING, namespace: str = "default"
) -> list[RunObject]:
    async with Client(platform.config) as krt:
        for name in names:
            await krt.create(Run.from_dict(manifest(name, source=source, namespace=namespace)))
        return [await krt.wait(name, namespace=namespace, timeout=60) for name in names]


async def _raw(
    platform: Platform,
    path: str,
    *,
    method: str = "GET",
    sent: dict[str, str] | None = None,
    body: bytes = b"",
) -> tuple[int, Any]:
    """One request sent byte for byte as written (no client normalizes its path)."""
    conn = await Connection.open(platform.config.gatewayUrl, platform.tls.ca_cert)
    try:
        await conn.send(
            request(
                path,
                method=method,
                headers={headers.AUTHORIZATION: f"Bearer {TOKEN}", **(sent or {})},
                body=body,
            )
        )
        answer = await conn.answer()
    finally:
        await conn.close()
    return answer.status, json.loads(answer.body) if answer.body else None


def _path(url: str) -> str:
    return urllib.parse.urlsplit(url).path


async def _accept(
    http: aiohttp.ClientSession, invoke: str, inv: str, body: bytes = b"{}"
) -> tuple[int, dict[str, str], Any]:
    return await call(http, "POST", invoke, body=body, sent={**ASYNC, headers.INVOCATION_ID: inv})


async def test_another_targets_invocation_is_never_read_listed_or_resubmitted_through_a_targets_url(
    platform: Platform, http: aiohttp.ClientSession
) -> None:
    a, b = await _runs(platform, unique("atk-a"), unique("atk-b"), source="def handle(p):\n    return p\n")
    assert a.metadata.uid is not None and b.metadata.uid is not None
    invoke_a, coll_a = urls(a)
    _, coll_b = urls(b)
    mine = [f"a{n}-{uuid.uuid4().hex[:6]}" for n in range(2)]
    for inv in mine:
        status, _, doc = await _accept(http, invoke_a, inv)
        assert status == 202, doc

    # A's id at B's URL (same namespace, same caller): not there, and nothing of A's
    status, _, doc = await call(http, "GET", f"{coll_b}/{mine[0]}")
    assert (status, doc["reason"]) == (404, "InvocationNotFound"), doc
    fresh = f"steal-{uuid.uuid4().hex[:6]}"
    status, _, doc = await call(
        http, "POST", f"{coll_b}/{mine[0]}:resubmit", body=b"", sent={headers.INVOCATION_ID: fresh}
    )
    assert (status, doc["reason"]) == (404, "InvocationNotFound"), doc
    assert not await recorded(platform, b.metadata.uid, fresh), "A's body resubmitted to B"
    assert not await recorded(platform, a.metadata.uid, fresh)
    # A's uid under another runtime, under another namespace, and at a Function's URL
    for elsewhere in (
        coll_a.replace("/runtimes/python/", "/runtimes/node/"),
        coll_a.replace("/namespaces/default/", "/namespaces/other/"),
        f"{platform.config.gatewayUrl}/v1/namespaces/default/functions/{a.metadata.uid}/invocations",
    ):
        status, _, doc = await call(http, "GET", f"{elsewhere}/{mine[0]}")
        assert (status, doc["reason"]) == (404, "InvocationNotFound"), (elsewhere, doc)
        status, _, doc = await call(
            http, "POST", f"{elsewhere}/{mine[0]}:resubmit", body=b"", sent={headers.INVOCATION_ID: fresh}
        )
        # a Function's URL of a uid it never saw: 503 NoReadyReplica while the gateway warms up
        assert status in (404, 503) and "state" not in doc, (elsewhere, doc)
        status, _, doc = await call(http, "GET", elsewhere)
        assert status in (200, 404), (elsewhere, doc)
        assert status == 404 or doc["items"] == [], ("another URL lists A's invocations", elsewhere, doc)
    assert not await recorded(platform, a.metadata.uid, fresh)

    # a `continue` token of A's list, taken to B's list: B's invocations only (none), never A's
    async def page_of_a() -> dict[str, Any]:
        status, _, doc = await call(http, "GET", f"{coll_a}?limit=1")
        assert status == 200, doc
        assert isinstance(doc, dict)
        return doc

    first = await eventually(page_of_a, what="A's list has a next page", until=lambda d: d["continue"])
    assert [i["invocationId"] for i in first["items"]][0] in mine
    status, _, doc = await call(http, "GET", f"{coll_a}?limit=1&continue={first['continue']}")
    assert status == 200 and [i["invocationId"] for i in doc["items"]] != first["items"], doc
    forged = base64.urlsafe_b64encode(
        b'{"CloseTime":"0001-01-01T00:00:00Z","StartTime":"2999-01-01T00:00:00Z","RunID":""}'
    ).decode()
    for token in (first["continue"], forged):
        status, _, doc = await call(http, "GET", f"{coll_b}?limit=1000&continue={token}")
        assert (status, doc["items"]) == (200, []), ("another target's token lists its invocations", doc)
    # `limit` at its edges
    status, _, doc = await call(http, "GET", f"{coll_a}?limit=1000")
    assert status == 200 and sorted(i["invocationId"] for i in doc["items"]) == sorted(mine), doc
    for bad in (
        "limit=-1",
        "limit=%2B1",
        "limit=1e3",
        "limit=1.0",
        "limit=%20%31",
        "limit=%D9%A1",
        f"limit={'9' * 40}",
        "limit=",
        "state=failed",
    ):
        status, _, doc = await call(http, "GET", f"{coll_a}?{bad}")
        assert (status, doc["reason"]) == (400, "InvalidRequest"), (bad, doc)


async def test_a_caller_who_may_not_get_the_target_cannot_tell_an_invocation_that_exists_from_one_that_does_not(
    platform: Platform, http: aiohttp.ClientSession
) -> None:
    (run,) = await _runs(platform, unique("atk-403"), source="def handle(p):\n    return p\n")
    invoke, coll = urls(run)
    inv = f"there-{uuid.uuid4().hex[:6]}"
    status, _, doc = await _accept(http, invoke, inv)
    assert status == 202, doc
    missing = f"never-{uuid.uuid4().hex[:6]}"
    nowhere = coll.replace(run.metadata.uid or "", str(uuid.uuid4()))
    seen: dict[tuple[str, str], tuple[int, Any]] = {}
    for method, suffix in (("GET", ""), ("POST", ":resubmit")):
        for where, one in (
            ("existing", f"{coll}/{inv}"),
            ("missing", f"{coll}/{missing}"),
            ("no target", f"{nowhere}/{inv}"),
        ):
            status, _, doc = await call(http, method, one + suffix, token=OTHER_TOKEN, body=b"")
            # a target that does not exist: 404 at a resubmit, as a sync invoke answers (its uid
            # is the platform's random UUID); never a status or a result
            assert (status, doc["reason"]) in ((403, "Forbidden"), (404, "RunNotFound")), (method, where, doc)
            assert where == "no target" or status == 403, (method, where, doc)
            assert set(doc) == {"reason", "message", "invocationId"}, doc
            doc.pop("invocationId", None)
            seen[(method, where)] = (status, doc)
        answers = {json.dumps(seen[(method, w)], sort_keys=True) for w in ("existing", "missing")}
        assert len(answers) == 1, ("the answers tell an existing invocation from a missing one", answers)
    fresh = f"bob-{uuid.uuid4().hex[:6]}"
    status, _, doc = await call(
        http,
        "POST",
        f"{coll}/{inv}:resubmit",
        token=OTHER_TOKEN,
        body=b"",
        sent={headers.INVOCATION_ID: fresh},
    )
    assert status == 403, doc
    assert not await recorded(platform, run.metadata.uid or "", fresh)


async def test_ids_that_play_with_the_path_are_refused_or_stay_one_id_of_their_own_target(
    platform: Platform, http: aiohttp.ClientSession
) -> None:
    (run,) = await _runs(platform, unique("atk-ids"), source="def handle(p):\n    return p\n")
    uid = run.metadata.uid
    assert uid is not None
    invoke, coll = urls(run)
    base = _path(coll)
    # after decoding: a NUL, non-ASCII, over 128 bytes: refused before anything is looked up
    for raw_id in ("a%00b", "%C3%A9", "%41" * 129, "%E2%80%AEx"):
        for method, suffix in (("GET", ""), ("POST", ":resubmit")):
            status, doc = await _raw(platform, f"{base}/{raw_id}{suffix}", method=method)
            assert (status, doc["reason"]) == (400, "InvalidInvocationId"), (raw_id, method, doc)
    status, doc = await _raw(
        platform, _path(invoke), method="POST", sent={**ASYNC, headers.INVOCATION_ID: "\xc3\xa9"}, body=b"{}"
    )
    assert status == 400, doc
    # encoded once: one segment, one id; encoded twice: the id that holds the `%`
    slash, encoded = f"x/{uuid.uuid4().hex[:6]}", f"%2F{uuid.uuid4().hex[:6]}"
    for inv in (slash, encoded):
        status, _, doc = await _accept(http, invoke, inv)
        assert status == 202 and doc["location"] == f"{base}/{urllib.parse.quote(inv, safe='')}", doc
    status, doc = await _raw(platform, f"{base}/{urllib.parse.quote(encoded, safe='')}")
    assert (status, doc["invocationId"]) == (200, encoded), doc
    status, doc = await _raw(platform, f"{base}/{encoded}")  # decoded once: "/" and the rest
    assert (status, doc["reason"]) == (404, "InvocationNotFound"), doc
    # dot segments: as one id, never the parent resource (a raw client sends them as they are)
    for dots in ("..", "%2E%2E", "x%2F..%2F..", "..%2F..%2F..%2Finvocations"):
        for method, suffix in (("GET", ""), ("POST", ":resubmit")):
            status, doc = await _raw(platform, f"{base}/{dots}{suffix}", method=method)
            assert (status, doc["reason"]) == (404, "InvocationNotFound"), (dots, method, doc)
    assert not await recorded(platform, uid, "..")


async def test_an_id_made_of_dots_is_refused_or_read_back_by_the_sdk(platform: Platform) -> None:
    """`.` and `..` are printable ASCII, but a client that follows RFC 3986 (the SDK's yarl, curl,
    a browser) removes them from a path, encoded or not: such an id is either refused at the accept
    or still read back through the SDK, never accepted and then out of reach."""
    (run,) = await _runs(platform, unique("atk-dots"), source="def handle(p):\n    return p\n")
    async with Client(platform.config) as krt:
        for inv in (".", ".."):
            try:
                accepted = await krt.invoke_async(run, {}, invocation_id=inv)
            except Exception as e:  # refused: the SDK's typed 400
                assert (
                    getattr(e, "status", None) == 400 and getattr(e, "reason", "") == "InvalidInvocationId"
                ), e
                assert not await recorded(platform, run.metadata.uid or "", inv)
                continue
            read = await krt.invocations.get(accepted)
            assert read.invocationId == inv, read


async def test_one_new_id_with_different_bodies_at_once_is_one_invocation_of_one_body_run_once(
    platform: Platform, http: aiohttp.ClientSession
) -> None:
    (run,) = await _runs(platform, unique("atk-race"))
    invoke, coll = urls(run)
    exchange = platform.shared / unique("race")
    exchange.mkdir()
    exchange.chmod(0o1777)
    calls = exchange / "calls"
    inv = f"race-{uuid.uuid4().hex[:6]}"
    bodies = [json.dumps({"log": str(calls), "n": n}).encode() for n in range(8)]
    answers = await asyncio.gather(*(_accept(http, invoke, inv, body) for body in bodies))
    won = [n for n, (status, _, _) in enumerate(answers) if status == 202]
    assert len(won) == 1, [(s, d) for s, _, d in answers]
    assert sorted(status for status, _, _ in answers) == [202] + [409] * 7, answers
    assert all(d["reason"] == "InvocationConflict" for s, _, d in answers if s == 409)

    async def status() -> dict[str, Any]:
        code, _, doc = await call(http, "GET", f"{coll}/{inv}")
        assert code == 200, doc
        assert isinstance(doc, dict)
        return doc

    done = await eventually(
        status, within=60, what="the invocation ended", until=lambda d: d["state"] in TERMINAL
    )
    assert done["state"] == "Succeeded" and json.loads(done["result"])["outputs"] == {"n": won[0]}, done
    assert calls.read_text().splitlines() == ["called"], "one run of one body"
    # the losing bodies again, one after the other: still 409, still one run
    for n in range(8):
        code, _, doc = await _accept(http, invoke, inv, bodies[n])
        assert code == (202 if n == won[0] else 409), (n, doc)
    assert calls.read_text().splitlines() == ["called"]


async def test_prefer_respond_async_is_a_preference_of_its_own_never_a_word_inside_another(
    platform: Platform, http: aiohttp.ClientSession
) -> None:
    (run,) = await _runs(platform, unique("atk-pref"), source="def handle(p):\n    return p\n")
    invoke, _ = urls(run)
    sync_ones = (
        'foo="x, respond-async, y"',  # a quoted value holds commas (RFC 7240 word = quoted-string)
        'foo="x, respond-async"',
        'foo="respond-async"',
        "return=minimal; respond-async",  # a parameter of `return`, not a preference
        "respond-asynchronous",
        "x-respond-async",
        "wait=respond-async",
    )
    for prefer in sync_ones:
        sent = {headers.PREFER: prefer, headers.INVOCATION_ID: f"p-{uuid.uuid4().hex[:6]}"}
        status, answer_headers, doc = await call(http, "POST", invoke, body=b'{"v": 1}', sent=sent)
        assert (status, doc.get("outputs")) == (200, {"v": 1}), (prefer, doc)
        assert headers.PREFERENCE_APPLIED not in answer_headers, prefer
    async_ones = (
        "RESPOND-ASYNC",
        " respond-async ;x=1",
        'foo="a,b", respond-async',
        "respond-async=",
        "wait=1,,respond-async",
    )
    for prefer in async_ones:
        sent = {headers.PREFER: prefer, headers.INVOCATION_ID: f"p-{uuid.uuid4().hex[:6]}"}
        status, _, doc = await call(http, "POST", invoke, body=b'{"v": 1}', sent=sent)
        assert status == 202, (prefer, doc)
    # two Prefer fields, respond-async in the second
    conn = await Connection.open(platform.config.gatewayUrl, platform.tls.ca_cert)
    try:
        head = {headers.AUTHORIZATION: f"Bearer {TOKEN}", "Prefer": "wait=5"}
        raw = request(_path(invoke), headers=head, body=b"{}")
        raw = raw.replace(b"\r\nContent-Length", b"\r\nPrefer: respond-async\r\nContent-Length", 1)
        await conn.send(raw)
        answer = await conn.answer()
    finally:
        await conn.close()
    assert answer.status == 202, answer


async def test_a_body_too_large_too_slow_or_not_json_is_refused_and_records_nothing(
    platform: Platform, http: aiohttp.ClientSession, invocations: AsyncInvocations
) -> None:
    (run,) = await _runs(platform, unique("atk-body"), source="def handle(p):\n    return p\n")
    uid = run.metadata.uid
    assert uid is not None
    invoke, _ = urls(run)
    path = _path(invoke)
    refused: list[str] = []

    async def raw(
        inv: str, data: bytes, *, length: int | None = None, chunked: bool = False
    ) -> tuple[int, Any]:
        refused.append(inv)
        conn = await Connection.open(platform.config.gatewayUrl, platform.tls.ca_cert)
        try:
            head = {headers.AUTHORIZATION: f"Bearer {TOKEN}", **ASYNC, headers.INVOCATION_ID: inv}
            if chunked:
                lines = [
                    f"POST {path} HTTP/1.1",
                    "Host: gateway",
                    *(f"{k}: {v}" for k, v in head.items()),
                    "Transfer-Encoding: chunked",
                ]
                await conn.send(("\r\n".join(lines) + "\r\n\r\n").encode())
                piece = 256 * 1024
                for at in range(0, len(data), piece):
                    chunk = data[at : at + piece]
                    try:
                        await conn.send(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                    except (ConnectionError, ssl.SSLError):
                        break
                else:
                    await conn.send(b"0\r\n\r\n")
            else:
                await conn.send(request(path, headers=head, body=data, content_length=length))
            answer = await conn.answer()
        finally:
            await conn.close()
        return answer.status, json.loads(answer.body)

    mib = 1024 * 1024
    status, doc = await raw(f"big-{uuid.uuid4().hex[:6]}", b"", length=2 * mib)
    assert (status, doc["reason"]) == (413, "PayloadTooLarge"), doc
    status, doc = await raw(f"chunked-{uuid.uuid4().hex[:6]}", b'"' + b"x" * (mib + 10) + b'"', chunked=True)
    assert (status, doc["reason"]) == (413, "PayloadTooLarge"), doc
    # within a MiB, but twice that once JSON-escaped as it is recorded
    status, doc = await raw(f"escaped-{uuid.uuid4().hex[:6]}", b'"' + b"\\\\" * (mib // 2 - 8) + b'"')
    assert (status, doc["reason"]) == (413, "PayloadTooLarge"), doc
    for data in (b"not json", b'{"a": 1', b'"\xff\xfe"', b"{}{}", b"\x00"):
        status, doc = await raw(f"nonjson-{uuid.uuid4().hex[:6]}", data)
        assert (status, doc.get("reason")) == (400, "MalformedJSON"), (data, status, doc)
    # slower than the minimum rate: 408, and nothing recorded
    saved = invocations.limits
    invocations.limits = HttpLimits(body_timeout_s=0.5, body_min_rate=4096)
    try:
        slow = f"slow-{uuid.uuid4().hex[:6]}"
        refused.append(slow)
        conn = await Connection.open(platform.config.gatewayUrl, platform.tls.ca_cert)
        try:
            head = {headers.AUTHORIZATION: f"Bearer {TOKEN}", **ASYNC, headers.INVOCATION_ID: slow}
            await conn.send(request(path, headers=head, body=b'{"a": "', content_length=100_000))

            async def dribble() -> None:
                for _ in range(100):
                    await conn.send(b"x")
                    await asyncio.sleep(0.05)

            task = asyncio.ensure_future(dribble())
            try:
                answer = await conn.answer()
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError, ssl.SSLError):
                    await task
        finally:
            await conn.close()
    finally:
        invocations.limits = saved
    assert (answer.status, json.loads(answer.body)["reason"]) == (408, "RequestBodyTimeout"), answer
    for inv in refused:
        assert not await recorded(platform, uid, inv), inv


async def test_a_continue_token_that_is_no_token_at_all_is_the_callers_400_not_503(
    platform: Platform, http: aiohttp.ClientSession
) -> None:
    (run,) = await _runs(platform, unique("atk-cont"), source="def handle(p):\n    return p\n")
    _, coll = urls(run)
    for garbage in (b"\x00" * 64, b"x", b"[]"):
        token = base64.urlsafe_b64encode(garbage).decode()
        status, _, doc = await call(http, "GET", f"{coll}?continue={token}")
        assert (status, doc["reason"]) == (400, "InvalidRequest"), (garbage, doc)


class NamedGrants:
    """A cluster's RBAC at the gateway's authorizer seam (tests/gateway_auth covers the real
    SelfSubjectAccessReview): the platform's token authenticates, and `get` is granted on the
    named targets only, as a Role with resourceNames grants it."""

    def __init__(self, inner: Authorizer, granted: set[tuple[str, str, str]]) -> None:
        self.inner = inner
        self.granted = granted  # (kind, namespace, name)
        self.asked: list[Resource] = []

    async def authorize(self, token: str, resource: Resource) -> Principal:
        principal = await self.inner.authorize(token, resource)
        self.asked.append(resource)
        if (resource.kind, resource.namespace, resource.name) not in self.granted:
            raise Forbidden(f"may not get {resource.kind} {resource.namespace}/{resource.name or '*'}")
        return principal

    async def close(self) -> None:
        return None


async def test_a_caller_granted_one_run_by_name_gets_nothing_of_another_runs_invocations(
    platform: Platform, http: aiohttp.ClientSession, invocations: AsyncInvocations
) -> None:
    x, y = await _runs(platform, unique("rbac-x"), unique("rbac-y"), source="def handle(p):\n    return p\n")
    assert x.metadata.uid is not None and y.metadata.uid is not None
    invoke_x, coll_x = urls(x)
    invoke_y, coll_y = urls(y)
    theirs = f"y-{uuid.uuid4().hex[:6]}"
    status, _, doc = await _accept(http, invoke_y, theirs)  # the namespace-wide token of the platform
    assert status == 202, doc
    saved = invocations.authorizer
    grants = NamedGrants(saved, {("runs", "default", x.metadata.name)})
    invocations.authorizer = grants
    try:
        mine = f"x-{uuid.uuid4().hex[:6]}"
        status, _, doc = await _accept(http, invoke_x, mine)
        assert status == 202, doc
        assert (await call(http, "GET", f"{coll_x}/{mine}"))[0] == 200
        assert (await call(http, "GET", coll_x))[0] == 200
        fresh = f"stolen-{uuid.uuid4().hex[:6]}"
        for method, url in (
            ("POST", invoke_y),
            ("GET", f"{coll_y}/{theirs}"),
            ("GET", f"{coll_y}/never-{uuid.uuid4().hex[:6]}"),
            ("GET", coll_y),
            ("POST", f"{coll_y}/{theirs}:resubmit"),
        ):
            status, _, doc = await call(
                http, method, url, body=b"{}", sent={**ASYNC, headers.INVOCATION_ID: fresh}
            )
            assert (status, doc["reason"]) == (403, "Forbidden"), (method, url, doc)
            assert set(doc) == {"reason", "message", "invocationId"}, doc
        # Y's invocation named at X's URL, which the caller may get: not X's, so not found
        status, _, doc = await call(http, "GET", f"{coll_x}/{theirs}")
        assert (status, doc["reason"]) == (404, "InvocationNotFound"), doc
        status, _, doc = await call(
            http, "POST", f"{coll_x}/{theirs}:resubmit", body=b"", sent={headers.INVOCATION_ID: fresh}
        )
        assert (status, doc["reason"]) == (404, "InvocationNotFound"), doc
        # X's uid at a Function's URL is asked about as a Function, never as the Run X
        status, _, doc = await call(
            http,
            "GET",
            f"{platform.config.gatewayUrl}/v1/namespaces/default/functions/{x.metadata.uid}/invocations",
        )
        assert status in (403, 404), doc
    finally:
        invocations.authorizer = saved
    assert not await recorded(platform, y.metadata.uid, fresh)
    assert not await recorded(platform, x.metadata.uid, fresh)
    names = {(r.kind, r.name) for r in grants.asked}
    assert ("runs", y.metadata.name) in names, "Y's reads were asked about Y by name"


async def test_slow_bodies_of_one_namespace_do_not_refuse_another_namespaces_accepts(
    platform: Platform, http: aiohttp.ClientSession, invocations: AsyncInvocations
) -> None:
    (mine,) = await _runs(platform, unique("slow-a"), source="def handle(p):\n    return p\n")
    namespace = unique("tenant")
    (theirs,) = await _runs(
        platform, unique("slow-b"), source="def handle(p):\n    return p\n", namespace=namespace
    )
    invoke_mine, _ = urls(mine)
    invoke_theirs, _ = urls(theirs)
    saved = invocations.max_in_flight
    invocations.max_in_flight = 2  # the gateway's bound, scaled down to two slow callers
    held: list[Connection] = []
    try:
        for _ in range(2):
            conn = await Connection.open(platform.config.gatewayUrl, platform.tls.ca_cert)
            held.append(conn)
            head = {
                headers.AUTHORIZATION: f"Bearer {TOKEN}",
                **ASYNC,
                headers.INVOCATION_ID: f"slow-{uuid.uuid4().hex[:6]}",
            }
            await conn.send(
                request(_path(invoke_mine), headers=head, body=b'{"a": "', content_length=100_000)
            )
        key = ("target", mine.metadata.namespace, mine.metadata.uid)

        def reading() -> bool:  # past their admission, each holding its target's backlog place
            held = invocations.backlog._counts.get(key)
            return held is not None and held.added >= 2

        await eventually(reading, what="both slow bodies being read")
        status, _, doc = await _accept(http, invoke_theirs, f"fast-{uuid.uuid4().hex[:6]}")
        assert status == 202, ("another namespace's accept refused behind slow bodies", doc)
    finally:
        invocations.max_in_flight = saved
        for conn in held:
            await conn.close()


async def test_an_async_timeout_under_a_millisecond_bounds_the_attempt_as_a_sync_invokes_does(
    platform: Platform, http: aiohttp.ClientSession
) -> None:
    """`X-Kruntime-Timeout: 0.0004` is a valid timeout (0 < t ≤ 900): a sync invoke of a function
    that sleeps a second does not succeed within it, and neither may its async attempt."""
    sleepy = "import time\ndef handle(p):\n    time.sleep(1)\n    return {'slept': 1}\n"
    (run,) = await _runs(platform, unique("atk-tmo"), source=sleepy)
    invoke, coll = urls(run)
    tiny = {headers.TIMEOUT: "0.0004"}
    status, _, doc = await call(http, "POST", invoke, body=b"{}", sent=tiny)
    assert status != 200, ("the sync invoke outlived its timeout", doc)
    inv = f"tmo-{uuid.uuid4().hex[:6]}"
    status, _, doc = await call(
        http, "POST", invoke, body=b"{}", sent={**ASYNC, **tiny, headers.INVOCATION_ID: inv}
    )
    assert status == 202, doc

    async def read() -> dict[str, Any]:
        code, _, doc = await call(http, "GET", f"{coll}/{inv}")
        assert code == 200, doc
        assert isinstance(doc, dict)
        return doc

    done = await eventually(
        read, within=60, until=lambda d: d["state"] in TERMINAL, what="the invocation ended"
    )
    assert done["state"] != "Succeeded", ("the async attempt ran with the default timeout instead", done)


async def test_a_functions_uid_at_a_runs_url_reaches_none_of_its_invocations(
    platform: Platform, http: aiohttp.ClientSession
) -> None:
    name = unique("atk-fn")
    document = manifest(name, source="def handle(p):\n    return p\n")
    async with Client(platform.config) as krt:
        await krt.functions.apply(Function.from_dict({**document, "kind": "Function"}))
        try:
            function = await krt.functions.wait_ready(name, timeout=90)
            assert function.status.endpoint is not None
            invoke = function.status.endpoint.url
            uid = _path(invoke).split("/")[-1].removesuffix(":invoke")
            inv = f"fn-{uuid.uuid4().hex[:6]}"
            status, _, doc = await _accept(http, invoke, inv)
            assert status == 202, doc
            as_run = f"{platform.config.gatewayUrl}/v1/namespaces/default/runtimes/python/functions/{uid}"
            fresh = f"fn-steal-{uuid.uuid4().hex[:6]}"
            status, _, doc = await call(http, "GET", f"{as_run}/invocations/{inv}")
            assert (status, doc["reason"]) == (404, "InvocationNotFound"), doc
            status, _, doc = await call(
                http,
                "POST",
                f"{as_run}/invocations/{inv}:resubmit",
                body=b"",
                sent={headers.INVOCATION_ID: fresh},
            )
            assert status == 404, doc
            status, _, doc = await call(http, "GET", f"{as_run}/invocations")
            assert (status, doc["items"]) == (200, []), doc
            status, _, doc = await _accept(http, f"{as_run}:invoke", fresh)
            assert status == 404, doc
            assert not await recorded(platform, uid, fresh)
            # and its own URL still has it
            status, _, doc = await call(http, "GET", f"{invoke.removesuffix(':invoke')}/invocations/{inv}")
            assert (status, doc["invocationId"]) == (200, inv), doc
        finally:
            await krt.functions.delete(name, timeout=120)


async def test_a_burst_of_new_ids_at_one_gateway_never_passes_the_targets_backlog(
    platform: Platform, http: aiohttp.ClientSession, invocations: AsyncInvocations
) -> None:
    """The bound is one gateway's own count (visibility's, then its accepts): six new ids sent at
    once when there is room for one are one 202 and five 429, not six accepted."""
    (run,) = await _runs(platform, unique("atk-burst"), source="def handle(p):\n    return p\n")
    uid = run.metadata.uid
    assert uid is not None
    invoke, _ = urls(run)
    backlog = invocations.backlog
    saved = backlog.cache_s, backlog.per_target
    backlog.cache_s = 3600.0  # counted once, then by this gateway's accepts
    backlog._counts.clear()
    try:
        status, _, doc = await _accept(http, invoke, f"first-{uuid.uuid4().hex[:6]}")
        assert status == 202, doc
        held = backlog._counts[("target", "default", uid)]
        backlog.per_target = held.count + held.added + 1  # room for one more
        ids = [f"burst{n}-{uuid.uuid4().hex[:6]}" for n in range(6)]
        # six kept-alive connections first, so the six requests arrive together
        await asyncio.gather(*(call(http, "GET", f"{platform.config.gatewayUrl}/healthz") for _ in ids))
        answers = await asyncio.gather(*(_accept(http, invoke, inv) for inv in ids))
        codes = sorted(status for status, _, _ in answers)
        assert codes == [202, 429, 429, 429, 429, 429], [(s, d) for s, _, d in answers]
        taken = [inv for inv in ids if await recorded(platform, uid, inv)]
        assert len(taken) == 1, taken
    finally:
        backlog.cache_s, backlog.per_target = saved
        backlog._counts.clear()
