"""Async invocations at the real gateway of the shared platform (issue #44, gateway/async_invoke.py),
over real HTTPS, against the real Temporal dev server and the worker's codec: `Prefer:
respond-async` is answered 202 only once its InvocationWorkflow is recorded (its input and digest
memo encrypted at rest, read back by the workers' own converter and codec); the same id with the
same body is the same invocation (one workflow run, sequentially and twenty at once), with another
body 409; the invocation is read back (its id percent-encoded), listed and resubmitted under a new
id with the same body; a caller who may not `get` the Run gets 403 and never the invocation; the
backlog bounds answer 429 and record nothing; Temporal unreachable is 503 and records nothing."""

from __future__ import annotations

import asyncio
import hashlib
import json
import ssl
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from temporalio.client import WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from kruntimes.api.function import Function
from kruntimes.api.run import Run
from kruntimes.contracts.invocation import (
    INVOCATION_DIGEST_MEMO,
    INVOCATION_WORKFLOW,
    TERMINAL_STATES,
    InvocationInput,
    InvocationState,
    invocation_workflow_id,
)
from kruntimes.gateway.async_invoke import RUN, AsyncInvocations, Backlog, Target
from kruntimes.gateway.errors import BacklogFull
from kruntimes.gateway.visibility import Visibility
from kruntimes.sdk.client import Client, RunObject
from kruntimes.temporal.codec import ENCODING
from kruntimes.temporal.settings import TemporalSettings
from kruntimes.wire import headers, search_typed
from tests.gateway.conftest import LogCapture
from tests.sdk.stack import OTHER_TOKEN, TOKEN, Platform, manifest, unique
from tests.support.ports import refusing_port
from tests.support.waiting import eventually

ASYNC = {headers.PREFER: "respond-async"}
STATES = {s.value for s in InvocationState}
TERMINAL = {s.value for s in TERMINAL_STATES}
# Appends a line to p['log'] for each call: the test counts what the function saw.
COUNTING = (
    "def handle(p):\n"
    "    with open(p['log'], 'a') as f:\n"
    "        f.write('called\\n')\n"
    "    return {'n': p['n']}\n"
)


@pytest.fixture
async def http(platform: Platform) -> AsyncIterator[aiohttp.ClientSession]:
    context = ssl.create_default_context(cafile=str(platform.tls.ca_cert))
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=context), timeout=aiohttp.ClientTimeout(total=60)
    ) as session:
        yield session


@pytest.fixture
async def run(platform: Platform) -> RunObject:
    async with Client(platform.config) as krt:
        name = unique("async-gw")
        await krt.create(Run.from_dict(manifest(name)))
        return await krt.wait(name, timeout=60)


@pytest.fixture
def invocations(platform: Platform) -> AsyncInvocations:
    found = platform.gateway.async_invocations
    assert found is not None
    return found


async def call(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    token: str | None = TOKEN,
    body: bytes | None = None,
    sent: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], Any]:
    """The answer's status, headers and JSON body; `url` is sent as it is (already encoded)."""
    request_headers = dict(sent or {})
    if token is not None:
        request_headers[headers.AUTHORIZATION] = f"Bearer {token}"
    async with http.request(
        method, aiohttp.client.URL(url, encoded=True), data=body, headers=request_headers
    ) as answer:
        raw = await answer.read()
        return answer.status, dict(answer.headers), json.loads(raw) if raw else None


def urls(run: RunObject) -> tuple[str, str]:
    """The Run's invoke URL and its invocations' collection URL."""
    assert run.status.endpoint is not None
    invoke = run.status.endpoint.url
    return invoke, invoke.removesuffix(":invoke") + "/invocations"


def handle_of(platform: Platform, uid: str, inv: str) -> WorkflowHandle[Any, Any]:
    return platform.temporal.get_workflow_handle(invocation_workflow_id("default", uid, inv))


async def recorded(platform: Platform, uid: str, inv: str) -> bool:
    try:
        await handle_of(platform, uid, inv).describe()
    except RPCError as e:
        assert e.status == RPCStatusCode.NOT_FOUND, e
        return False
    return True


async def test_an_async_invoke_is_recorded_once_per_id_read_back_listed_and_resubmitted(
    platform: Platform, http: aiohttp.ClientSession, run: RunObject
) -> None:
    invoke, collection = urls(run)
    uid = run.metadata.uid
    assert uid is not None
    inv = f"ord/{uuid.uuid4().hex[:6]} ?#%:x"  # each character a path must percent-encode
    one = f"{collection}/{urllib.parse.quote(inv, safe='')}"
    path = urllib.parse.urlsplit(one).path
    body = b'{"n": 1, "text": "\\u00e9\\"q\\""}'
    status, answer_headers, doc = await call(
        http, "POST", invoke, body=body, sent={**ASYNC, headers.INVOCATION_ID: inv}
    )
    assert status == 202, doc
    assert doc == {"invocationId": inv, "state": "Queued", "location": path}
    assert answer_headers[headers.LOCATION] == path
    assert answer_headers[headers.PREFERENCE_APPLIED] == "respond-async"
    assert answer_headers[headers.INVOCATION_ID] == inv

    # recorded: one InvocationWorkflow, its input and digest encrypted at rest, read by the
    # workers' own converter and codec
    handle = handle_of(platform, uid, inv)
    described = await handle.describe()
    assert described.workflow_type == INVOCATION_WORKFLOW and described.task_queue == "kruntimes"
    digest = hashlib.sha256(body).hexdigest()
    assert await described.memo_value(INVOCATION_DIGEST_MEMO) == digest
    stored = described.raw_description.workflow_execution_info.memo.fields[INVOCATION_DIGEST_MEMO]
    assert stored.metadata["encoding"] == ENCODING
    attributes = described.typed_search_attributes
    assert attributes.get(search_typed.KRT_NAMESPACE) == "default"
    assert attributes.get(search_typed.KRT_RUN_UID) == uid
    first = [e async for e in handle.fetch_history_events()][0]
    (payload,) = first.workflow_execution_started_event_attributes.input.payloads
    assert payload.metadata["encoding"] == ENCODING, "the body is never plain in history"
    (decoded,) = await platform.temporal.data_converter.decode([payload], [InvocationInput])
    assert isinstance(decoded, InvocationInput)
    assert (decoded.body, decoded.bodySha256, decoded.invocationId) == (body.decode(), digest, inv)
    assert (decoded.target.uid, decoded.target.name, decoded.target.runtime) == (
        uid,
        run.metadata.name,
        "python",
    )
    assert decoded.caller == "alice" and decoded.timeoutSeconds is None

    # the same id and body: the same invocation, once after the other and twenty at once
    for answer in [
        await call(http, "POST", invoke, body=body, sent={**ASYNC, headers.INVOCATION_ID: inv}),
        *await asyncio.gather(
            *(
                call(http, "POST", invoke, body=body, sent={**ASYNC, headers.INVOCATION_ID: inv})
                for _ in range(20)
            )
        ),
    ]:
        assert answer[0] == 202 and answer[2]["location"] == path, answer
    status, _, doc = await call(
        http, "POST", invoke, body=b'{"n": 2}', sent={**ASYNC, headers.INVOCATION_ID: inv}
    )
    assert (status, doc["reason"], doc["invocationId"]) == (409, "InvocationConflict", inv)
    assert (await handle.describe()).run_id == described.run_id, "never a second run of one id"

    # read back, by its percent-encoded id
    status, answer_headers, doc = await call(http, "GET", one)
    assert status == 200, doc
    assert doc["invocationId"] == inv and doc["state"] in STATES
    assert doc["target"]["uid"] == uid and doc["target"]["namespace"] == "default"
    assert answer_headers[headers.INVOCATION_ID] == inv
    status, _, doc = await call(http, "GET", f"{collection}/never-{uuid.uuid4().hex}")
    assert (status, doc["reason"]) == (404, "InvocationNotFound")
    status, _, doc = await call(http, "GET", f"{collection}/{'x' * 129}")
    assert (status, doc["reason"]) == (400, "InvalidInvocationId")

    # listed (visibility shows it a little after the start)
    async def listed() -> list[str]:
        status, _, doc = await call(http, "GET", f"{collection}?limit=1000")
        assert status == 200, doc
        assert "result" not in json.dumps([sorted(i) for i in doc["items"]]).split('"')
        return [item["invocationId"] for item in doc["items"]]

    assert await eventually(listed, what="the invocation listed", until=lambda ids: inv in ids) == [inv]
    for bad in ("state=Bogus", "limit=0", "limit=1001", "limit=x", "continue=%2A%2A"):
        status, _, doc = await call(http, "GET", f"{collection}?{bad}")
        assert (status, doc["reason"]) == (400, "InvalidRequest"), bad

    # resubmitted under a new id, with the same body
    fresh = f"again-{uuid.uuid4().hex[:6]}"
    status, _, doc = await call(
        http, "POST", f"{one}:resubmit", body=b"", sent={headers.INVOCATION_ID: fresh}
    )
    assert status == 202, doc
    assert doc["invocationId"] == fresh and doc["location"].endswith(f"/invocations/{fresh}")
    again = [e async for e in handle_of(platform, uid, fresh).fetch_history_events()][0]
    (payload,) = again.workflow_execution_started_event_attributes.input.payloads
    (resent,) = await platform.temporal.data_converter.decode([payload], [InvocationInput])
    assert resent.body == body.decode() and resent.bodySha256 == digest
    status, _, doc = await call(http, "POST", f"{collection}/never-{uuid.uuid4().hex}:resubmit")
    assert (status, doc["reason"]) == (404, "InvocationNotFound")


async def test_an_accepted_invocation_runs_once_and_its_answer_is_read_back(
    platform: Platform, http: aiohttp.ClientSession
) -> None:
    async with Client(platform.config) as krt:
        name = unique("async-e2e")
        await krt.create(Run.from_dict(manifest(name, source=COUNTING)))
        run = await krt.wait(name, timeout=60)
    exchange = platform.shared / unique("calls")  # a directory the function sees too
    exchange.mkdir()
    exchange.chmod(0o1777)
    calls = exchange / "calls"
    invoke, collection = urls(run)
    inv = f"e2e/{uuid.uuid4().hex[:6]} ?#"
    body = json.dumps({"log": str(calls), "n": 5}).encode()
    sent = {**ASYNC, headers.INVOCATION_ID: inv}
    answers = await asyncio.gather(*(call(http, "POST", invoke, body=body, sent=sent) for _ in range(5)))
    assert {(status, doc["location"]) for status, _, doc in answers} == {(202, answers[0][2]["location"])}
    one = f"{collection}/{urllib.parse.quote(inv, safe='')}"

    async def status() -> dict[str, Any]:
        code, _, doc = await call(http, "GET", one)
        assert code == 200, doc
        assert isinstance(doc, dict)
        return doc

    done = await eventually(
        status, within=60, what="the invocation ended", until=lambda d: d["state"] in TERMINAL
    )
    assert done["state"] == "Succeeded", done
    assert done["attemptCount"] == 1 and done["endedAt"] and done["expiresAt"], done
    answer = json.loads(done["result"])
    assert (answer["status"], answer["outputs"], answer["invocationId"]) == ("Succeeded", {"n": 5}, inv)
    assert calls.read_text().splitlines() == ["called"], "five submissions of one id ran it once"
    code, _, doc = await call(http, "POST", invoke, body=body, sent=sent)
    assert (code, doc["state"]) == (202, "Succeeded"), "the same id again: the invocation that ran"
    # RFC 7240: among other preferences, any case, with parameters; none of it: a sync invoke
    fresh = {headers.INVOCATION_ID: f"pref-{uuid.uuid4().hex[:6]}"}
    for prefer in ("wait=5, Respond-Async; x=1", "return=minimal,respond-async"):
        code, answer_headers, doc = await call(
            http, "POST", invoke, body=body, sent={**fresh, "Prefer": prefer}
        )
        assert code == 202 and answer_headers[headers.PREFERENCE_APPLIED] == "respond-async", (prefer, doc)
    code, answer_headers, doc = await call(
        http, "POST", invoke, body=body, sent={"Prefer": "return=minimal, respond-asynchronously"}
    )
    assert code == 200 and doc["outputs"] == {"n": 5}, doc
    assert headers.PREFERENCE_APPLIED not in answer_headers
    await eventually(
        lambda: len(calls.read_text().splitlines()) == 3, what="the sync call and the other id ran"
    )


async def test_a_functions_url_takes_async_invocations_run_on_its_replicas(
    platform: Platform, http: aiohttp.ClientSession
) -> None:
    exchange = platform.shared / unique("fn-calls")
    exchange.mkdir()
    exchange.chmod(0o1777)
    calls = exchange / "calls"
    async with Client(platform.config) as krt:
        name = unique("async-fn")
        await krt.functions.apply(Function.from_dict({**manifest(name, source=COUNTING), "kind": "Function"}))
        try:
            function = await krt.functions.wait_ready(name, timeout=90)
            assert function.status.endpoint is not None
            invoke = function.status.endpoint.url
            assert "/functions/" in invoke and "/runtimes/" not in invoke
            collection = invoke.removesuffix(":invoke") + "/invocations"
            uid = urllib.parse.urlsplit(invoke).path.split("/")[-1].removesuffix(":invoke")
            inv = f"fn-{uuid.uuid4().hex[:6]}"
            body = json.dumps({"log": str(calls), "n": 9}).encode()
            status, _, doc = await call(
                http, "POST", invoke, body=body, sent={**ASYNC, headers.INVOCATION_ID: inv}
            )
            assert status == 202 and doc["location"] == urllib.parse.urlsplit(f"{collection}/{inv}").path, doc
            described = await handle_of(platform, uid, inv).describe()
            assert described.typed_search_attributes.get(search_typed.KRT_FUNCTION) == uid
            assert described.typed_search_attributes.get(search_typed.KRT_RUN_UID) is None

            async def status_now() -> dict[str, Any]:
                code, _, doc = await call(http, "GET", f"{collection}/{inv}")
                assert code == 200, doc
                assert isinstance(doc, dict)
                return doc

            done = await eventually(
                status_now, within=60, what="the invocation ended", until=lambda d: d["state"] in TERMINAL
            )
            assert done["state"] == "Succeeded" and done["target"]["kind"] == "Function", done
            assert json.loads(done["result"])["outputs"] == {"n": 9}
            assert calls.read_text().splitlines() == ["called"]

            async def succeeded() -> list[str]:
                code, _, doc = await call(http, "GET", f"{collection}?state=Succeeded")
                assert code == 200, doc
                return [item["invocationId"] for item in doc["items"]]

            await eventually(succeeded, what="listed as Succeeded", until=lambda ids: inv in ids)
        finally:
            await krt.functions.delete(name, timeout=120)


async def test_a_caller_who_may_not_get_the_run_never_sees_its_invocations(
    platform: Platform, http: aiohttp.ClientSession, run: RunObject, log_capture: LogCapture
) -> None:
    invoke, collection = urls(run)
    inv = f"secret-{uuid.uuid4().hex[:6]}"
    status, _, doc = await call(
        http, "POST", invoke, body=b'{"x": 1}', sent={**ASYNC, headers.INVOCATION_ID: inv}
    )
    assert status == 202, doc
    one = f"{collection}/{inv}"
    for method, url in (
        ("GET", one),
        ("GET", collection),
        ("POST", f"{one}:resubmit"),
        ("POST", invoke),
    ):
        status, _, doc = await call(http, method, url, token=OTHER_TOKEN, sent=ASYNC, body=b"{}")
        assert (status, doc["reason"]) == (403, "Forbidden"), (method, url, doc)
        assert set(doc) == {"reason", "message", "invocationId"}, "an error body, nothing of the invocation"
        status, _, doc = await call(http, method, url, token=None, sent=ASYNC, body=b"{}")
        assert (status, doc["reason"]) == (401, "Unauthenticated"), (method, url)
    # another namespace's URL of the same uid: nothing there, whoever asks
    other = one.replace("/namespaces/default/", "/namespaces/other/")
    status, _, doc = await call(http, "GET", other)
    assert (status, doc["reason"]) == (404, "InvocationNotFound")
    # the Run's uid at a Function's URL: neither its invocations nor a Function to invoke
    function = f"{platform.config.gatewayUrl}/v1/namespaces/default/functions/{run.metadata.uid}"
    status, _, doc = await call(http, "GET", f"{function}/invocations/{inv}")
    assert (status, doc["reason"]) == (404, "InvocationNotFound")
    balancer = platform.gateway.balancer  # a fresh gateway answers a Function it never saw 503
    await eventually(lambda: time.monotonic() >= balancer.warm_until, what="the gateway past its warm-up")
    status, _, doc = await call(http, "POST", f"{function}:invoke", body=b"{}", sent=ASYNC)
    assert (status, doc["reason"]) == (404, "FunctionNotFound")
    status, _, doc = await call(
        http, "GET", f"{function.replace(run.metadata.uid or '', 'not-a-uid')}/invocations"
    )
    assert (status, doc["reason"]) == (404, "InvocationNotFound")
    leaked = [t for t in (TOKEN, OTHER_TOKEN) if any(t in line for line in log_capture.lines)]
    assert not leaked, "a token in the gateway's log records"


async def test_the_backlog_bounds_refuse_past_them_and_record_nothing(
    platform: Platform, http: aiohttp.ClientSession, run: RunObject, invocations: AsyncInvocations
) -> None:
    invoke, _ = urls(run)
    uid = run.metadata.uid
    assert uid is not None
    backlog = invocations.backlog
    saved = (backlog.per_target, backlog.per_namespace, backlog.cache_s)
    # counted once, then by this gateway's own accepts: no count runs while the test looks
    backlog.cache_s = 3600.0
    backlog._counts.clear()
    try:
        backlog.per_target = 1
        first, refused = f"b1-{uuid.uuid4().hex[:6]}", f"b2-{uuid.uuid4().hex[:6]}"
        status, _, doc = await call(
            http, "POST", invoke, body=b"{}", sent={**ASYNC, headers.INVOCATION_ID: first}
        )
        assert status == 202, doc
        status, answer_headers, doc = await call(
            http, "POST", invoke, body=b"{}", sent={**ASYNC, headers.INVOCATION_ID: refused}
        )
        assert (status, doc["reason"]) == (429, "AsyncBacklogFull"), doc
        assert answer_headers[headers.RETRY_AFTER] == "5"
        backlog.per_target, backlog.per_namespace = saved[0], 1
        status, _, doc = await call(
            http, "POST", invoke, body=b"{}", sent={**ASYNC, headers.INVOCATION_ID: refused}
        )
        assert (status, doc["reason"]) == (429, "AsyncBacklogFull"), doc
        assert not await recorded(platform, uid, refused), "a refused invocation is not recorded"
    finally:
        backlog.per_target, backlog.per_namespace, backlog.cache_s = saved
        backlog._counts.clear()


async def test_the_backlog_is_the_queued_invocations_visibility_counts(platform: Platform) -> None:
    """Queued InvocationWorkflows of a target (stand-ins on a task queue nobody polls, so they
    stay Queued) count against its bound; another target's, or ended ones, do not."""
    target = Target(RUN, "default", str(uuid.uuid4()), "x", "python")
    queue = f"nobody-{uuid.uuid4().hex[:6]}"
    started: list[WorkflowHandle[Any, Any]] = []
    for n, uid in enumerate((target.uid, target.uid, str(uuid.uuid4()))):
        started.append(
            await platform.temporal.start_workflow(
                INVOCATION_WORKFLOW,
                id=invocation_workflow_id("default", uid, f"stand-in-{n}"),
                task_queue=queue,
                search_attributes=TypedSearchAttributes(
                    [
                        SearchAttributePair(search_typed.KRT_NAMESPACE, "default"),
                        SearchAttributePair(search_typed.KRT_PHASE, "Queued"),
                        SearchAttributePair(search_typed.KRT_RUN_UID, uid),
                    ]
                ),
            )
        )
    visibility = await Visibility.connect(TemporalSettings(address=platform.dev_server.address))
    try:

        async def admitted(bound: int) -> bool:
            try:
                await Backlog(per_target=bound, per_namespace=10**6, cache_s=0).admit(visibility, target)
            except BacklogFull:
                return False
            return True

        await eventually(lambda: admitted(2), what="two Queued counted", until=lambda ok: not ok)
        assert await admitted(3), "the other target's invocation is not this target's"
        await started[0].terminate("test")
        await eventually(lambda: admitted(2), what="an ended one no longer counted")
    finally:
        for handle in started[1:]:
            await handle.terminate("test")
        await visibility.close()


async def test_temporal_unreachable_is_503_and_records_nothing(
    platform: Platform, http: aiohttp.ClientSession, run: RunObject, invocations: AsyncInvocations
) -> None:
    invoke, collection = urls(run)
    uid = run.metadata.uid
    assert uid is not None
    inv = f"down-{uuid.uuid4().hex[:6]}"
    saved, saved_bound = invocations.temporal, invocations.max_in_flight
    with refusing_port() as port:
        invocations.temporal = Visibility(TemporalSettings(address=f"127.0.0.1:{port}"))
        invocations.backlog._counts.clear()
        try:
            for method, url in (("POST", invoke), ("GET", f"{collection}/{inv}"), ("GET", collection)):
                status, answer_headers, doc = await call(
                    http, method, url, body=b"{}", sent={**ASYNC, headers.INVOCATION_ID: inv}
                )
                assert (status, doc["reason"]) == (503, "AsyncUnavailable"), (method, url, doc)
                assert answer_headers[headers.RETRY_AFTER] == "2"
        finally:
            await invocations.temporal.close()
            invocations.temporal = saved
            invocations.backlog._counts.clear()
    assert not await recorded(platform, uid, inv)
    invocations.max_in_flight = 0  # as many async requests in flight as it may: refused at once
    try:
        status, _, doc = await call(http, "GET", f"{collection}/{inv}")
        assert (status, doc["reason"]) == (503, "AsyncUnavailable")
    finally:
        invocations.max_in_flight = saved_bound
    invocations.temporal = None  # a gateway without Temporal at all
    try:
        status, _, doc = await call(
            http, "POST", invoke, body=b"{}", sent={**ASYNC, headers.INVOCATION_ID: inv}
        )
        assert (status, doc["reason"]) == (503, "AsyncUnavailable")
    finally:
        invocations.temporal = saved
    # the same id once Temporal answers again: recorded
    status, _, doc = await call(http, "POST", invoke, body=b"{}", sent={**ASYNC, headers.INVOCATION_ID: inv})
    assert status == 202, doc
    assert await recorded(platform, uid, inv)
