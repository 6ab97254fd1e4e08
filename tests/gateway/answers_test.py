"""Every row of the gateway's answers table, end to end: real HTTPS, real host processes.

Functions that must run at most once per invocation append a line to a record file (passed in
their environment), so "ran exactly once, never retried" is checked by counting lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from kruntimes.api.limits import MAX_INVOCATION_ID_BYTES, MAX_LOG_BYTES, MAX_PAYLOAD_BYTES
from kruntimes.gateway import openapi
from kruntimes.gateway.auth import Principal, Resource
from kruntimes.gateway.server import Gateway
from kruntimes.pki import Identity
from kruntimes.pki.local import TlsFiles
from kruntimes.temporal.known_runs import KnownRun
from kruntimes.wire.headers import INVOCATION_ID as INVOCATION_HEADER
from kruntimes.wire.headers import TIMEOUT as TIMEOUT_HEADER
from tests.gateway.conftest import (
    ALICE,
    BOB,
    BOGUS,
    REGISTERED,
    SECRETS,
    Answer,
    Function,
    HostProcess,
    Hosts,
    LogCapture,
    invoke,
    invoke_url,
    leaked_tokens,
    lines,
    recording,
    wait_for,
    wait_route,
)
from tests.support.beats import heartbeat, registration
from tests.support.pki import TestPKI
from tests.support.procs import descendants
from tests.support.procs import same_alive as alive
from tests.support.stack import local_gateway_options

# Appends its tag to the record file, then sleeps as asked.
RECORDED = """
import os
import time

def handle(payload):
    with open(os.environ["TEST_RECORD"], "a") as f:
        f.write(payload.get("tag", "run") + "\\n")
    time.sleep(payload.get("sleep", 0))
    return {"slept": payload.get("sleep", 0)}
"""

# Appends to the record file, then ends its process in the middle of the invocation.
EXITS = """
import os

def handle(payload):
    with open(os.environ["TEST_RECORD"], "a") as f:
        f.write("run\\n")
    os._exit(3)
"""

# Loads once; any later load (a restart of its warm process) fails; its invocation ends the process.
LOADS_ONCE = """
import os
from pathlib import Path

marker = Path(os.environ["TEST_RECORD"] + ".loaded")
if marker.exists():
    raise RuntimeError("this module refuses to load twice")
marker.write_text("loaded")

def handle(payload):
    with open(os.environ["TEST_RECORD"], "a") as f:
        f.write("run\\n")
    os._exit(3)
"""

NOISY = """
import sys

def handle(payload):
    sys.stdout.write("o" * 100_000)
    sys.stderr.write("e" * 70_000)
    return {"n": 1}
"""

SIZE = """
import json

def handle(payload):
    return {"length": len(json.dumps(payload))}
"""


def check_error(answer: Answer, status: int, reason: str) -> dict[str, object]:
    """An error answer: JSON with a stable reason and the (echoed or generated) invocation id."""
    answer.expect(status, reason)
    doc: dict[str, object] = answer.json
    assert set(doc) == {"reason", "message", "invocationId"}
    return doc


def retry_after(answer: Answer) -> int:
    value = answer.headers.get("Retry-After")
    assert value is not None and value.isdigit() and int(value) >= 1, answer.headers
    return int(value)


# -- 200 --------------------------------------------------------------------------------------


async def test_success_returns_outputs_logs_and_the_echoed_invocation_id(
    gateway: Gateway, client: aiohttp.ClientSession, echo: Function
) -> None:
    answer = await invoke(client, gateway, echo.uid, {"a": 1}, headers={INVOCATION_HEADER: "inv-fixed-1"})
    doc = answer.expect(200).json
    assert doc["invocationId"] == "inv-fixed-1"
    assert doc["status"] == "Succeeded"
    assert doc["outputs"] == {"a": 1}
    assert doc["stdout"] == {"data": "", "truncated": False, "totalBytes": 0}
    assert doc["stderr"] == {"data": "echo\n", "truncated": False, "totalBytes": 5}
    assert doc["durationMs"] >= 0

    # generated when absent: a fresh one every time, in the header and the body alike
    first = (await invoke(client, gateway, echo.uid, [1, 2])).expect(200).json
    second = (await invoke(client, gateway, echo.uid, [1, 2])).expect(200).json
    assert first["outputs"] == {"result": [1, 2]}
    assert str(uuid.UUID(first["invocationId"])) == first["invocationId"]
    assert first["invocationId"] != second["invocationId"]

    # the largest invocation id, and one of every printable ASCII sign, are echoed as they are
    longest = "i" * MAX_INVOCATION_ID_BYTES
    answer = await invoke(client, gateway, echo.uid, headers={INVOCATION_HEADER: longest})
    assert answer.expect(200).json["invocationId"] == longest
    answer = await invoke(client, gateway, echo.uid, headers={INVOCATION_HEADER: "req 1~!@#$%^&*()"})
    assert answer.expect(200).json["invocationId"] == "req 1~!@#$%^&*()"

    # an empty body is no payload, not malformed JSON
    assert (await invoke(client, gateway, echo.uid, b"")).expect(200).json["status"] == "Succeeded"


async def test_stdout_and_stderr_are_bounded_with_truncation_flags(
    gateway: Gateway, client: aiohttp.ClientSession, main_host: HostProcess
) -> None:
    noisy = await main_host.register(gateway, NOISY)
    doc = (await invoke(client, gateway, noisy.uid)).expect(200).json
    assert doc["outputs"] == {"n": 1}
    assert doc["stdout"]["truncated"] is True
    assert doc["stdout"]["totalBytes"] == 100_000
    assert doc["stdout"]["data"] == "o" * MAX_LOG_BYTES
    assert doc["stderr"]["truncated"] is True
    assert doc["stderr"]["totalBytes"] == 70_000
    assert doc["stderr"]["data"] == "e" * MAX_LOG_BYTES


# -- 401 / 403 / 404 ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        f"Bearer {BOGUS}",
        f"Basic {ALICE}",
        f"Bearer {ALICE} extra",
        f"Bearer\t{ALICE}",
        "Bearer " + "t" * 8180,  # just under the HTTP parser's 8190-byte header limit
    ],
    ids=["missing", "empty", "no-token", "blank-token", "unknown", "basic", "two-words", "tab", "long"],
)
async def test_401_without_a_valid_token(
    gateway: Gateway, client: aiohttp.ClientSession, echo: Function, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    answer = await invoke(client, gateway, echo.uid, token=None, headers=headers)
    check_error(answer, 401, "Unauthenticated")


async def test_an_unknown_uid_reveals_nothing_without_a_valid_token(
    gateway: Gateway, client: aiohttp.ClientSession, echo: Function
) -> None:
    check_error(await invoke(client, gateway, str(uuid.uuid4()), token=BOGUS), 401, "Unauthenticated")
    check_error(await invoke(client, gateway, echo.uid, token=BOGUS), 401, "Unauthenticated")


async def test_403_when_the_caller_may_not_get_the_run(
    gateway: Gateway, client: aiohttp.ClientSession, echo: Function
) -> None:
    answer = await invoke(client, gateway, echo.uid, token=BOB, headers={INVOCATION_HEADER: "inv-403"})
    doc = check_error(answer, 403, "Forbidden")
    assert doc["invocationId"] == "inv-403"
    assert BOB not in json.dumps(doc)


async def test_404_for_unknown_uids_and_uids_of_another_namespace_or_runtime(
    gateway: Gateway, client: aiohttp.ClientSession, echo: Function
) -> None:
    check_error(await invoke(client, gateway, str(uuid.uuid4())), 404, "RunNotFound")
    # bob may invoke in "other", but this Run is not there: not found, not forbidden
    check_error(await invoke(client, gateway, echo.uid, token=BOB, namespace="other"), 404, "RunNotFound")
    check_error(await invoke(client, gateway, echo.uid, runtime="bash"), 404, "RunNotFound")
    # known Runs that cannot be this one: finished, or of another namespace or runtime
    finished, elsewhere = str(uuid.uuid4()), str(uuid.uuid4())
    gateway.known.runs[finished] = KnownRun(
        namespace="default", name="done", runtime="python", phase="Succeeded"
    )
    gateway.known.runs[elsewhere] = KnownRun(namespace="other", name="far", runtime="python", phase="Pending")
    try:
        check_error(await invoke(client, gateway, finished), 404, "RunNotFound")
        check_error(await invoke(client, gateway, elsewhere), 404, "RunNotFound")
        check_error(
            await invoke(client, gateway, elsewhere, runtime="bash", token=BOB, namespace="other"),
            404,
            "RunNotFound",
        )
    finally:
        del gateway.known.runs[finished], gateway.known.runs[elsewhere]


@pytest.mark.parametrize("uid", ["..", "not-a-uuid", "..%2F..%2Fx", "UPPER"])
async def test_a_path_uid_that_is_no_run_uid_is_not_found_and_looked_up_nowhere(
    gateway: Gateway, client: aiohttp.ClientSession, echo: Function, uid: str
) -> None:
    if uid == "UPPER":  # another spelling of a routed Run is not that Run
        uid = echo.uid.upper()
    # even a known-Runs entry under that spelling is not consulted
    gateway.known.runs[uid] = KnownRun(namespace="default", name="odd", runtime="python", phase="Pending")
    try:
        check_error(await invoke(client, gateway, uid), 404, "RunNotFound")
        check_error(await invoke(client, gateway, uid, token=BOGUS), 401, "Unauthenticated")
    finally:
        del gateway.known.runs[uid]


@pytest.mark.parametrize(
    ("runtime", "uid"),
    [("python", "TOKEN"), ("python", "x" * 4000), ("python", "..%2F..%2Fetc"), ("TOKEN", "VALID")],
    ids=["token-as-uid", "long-uid", "path-uid", "token-as-runtime"],
)
async def test_the_access_log_shows_only_a_valid_run_uid_and_runtime(
    gateway: Gateway,
    client: aiohttp.ClientSession,
    echo: Function,
    log_capture: LogCapture,
    runtime: str,
    uid: str,
) -> None:
    """Whatever a caller puts in the path (its own token, a path, kilobytes) never reaches a log:
    the access log shows the path's run uid only if it is a canonical UUID, its runtime only if it
    is a DNS-1123 label."""
    secret = f"Tok_in_path_{uuid.uuid4().hex}"  # a token's shape: neither a UUID nor a label
    uid, runtime = (secret if v == "TOKEN" else echo.uid if v == "VALID" else v for v in (uid, runtime))
    answer = await invoke(client, gateway, uid, runtime=runtime)
    check_error(answer, 404, "RunNotFound")
    logged = [
        r
        for r in log_capture.records
        if getattr(r, "invocation_id", None) == answer.json["invocationId"] and r.getMessage() == "invoke"
    ]
    assert len(logged) == 1
    fields = (logged[0].run_uid, logged[0].runtime)  # type: ignore[attr-defined]
    assert fields == ((echo.uid, "") if uid == echo.uid else ("", "python")), fields
    shown = secret if uid == echo.uid else uid
    assert not [line for line in log_capture.lines if secret in line or shown in line]


# -- 503 ------------------------------------------------------------------------------------------


async def test_503_for_a_known_run_without_a_route(gateway: Gateway, client: aiohttp.ClientSession) -> None:
    uid = str(uuid.uuid4())
    gateway.known.runs[uid] = KnownRun(
        namespace="default", name="starting", runtime="python", phase="Pending"
    )
    try:
        answer = await invoke(client, gateway, uid)
        check_error(answer, 503, "RunNotReady")
        assert retry_after(answer) >= 1
        # existence is revealed only to callers who may get the Run
        check_error(await invoke(client, gateway, uid, token=BOB), 403, "Forbidden")
        check_error(await invoke(client, gateway, uid, token=BOGUS), 401, "Unauthenticated")
    finally:
        del gateway.known.runs[uid]
    check_error(await invoke(client, gateway, uid), 404, "RunNotFound")


async def test_503_when_the_warm_process_cannot_restart(
    gateway: Gateway, client: aiohttp.ClientSession, main_host: HostProcess, records_dir: Path
) -> None:
    path, fn = await recording(main_host, gateway, records_dir, LOADS_ONCE)
    # the invocation ends the process (502); restarting it fails, so the registration is NotReady
    check_error(await invoke(client, gateway, fn.uid), 502, "FunctionProcessExited")
    route = await wait_route(gateway, fn.uid, ready=False)
    assert route.host_uid == main_host.host_uid
    answer = await invoke(client, gateway, fn.uid)
    check_error(answer, 503, "RunNotReady")
    retry_after(answer)
    assert lines(path) == ["run"]  # the refused invocation never reached the function


async def _claim(
    gateway: Gateway,
    pki: TestPKI,
    fn: Function,
    *,
    attempt: int,
    host: tuple[str, str, str],
    invoke_address: str | None = None,
) -> None:
    """Apply a snapshot of `host` (id, uid, address; signed for it) holding `attempt` of `fn`,
    with its signed assignment: the gateway routes that attempt there from then on."""
    host_id, host_uid, address = host
    held = registration(
        pki, fn.uid, host_id=host_id, host_uid=host_uid, attempt=attempt, registration_id=fn.registration_id
    )
    beat = heartbeat(
        host_id=host_id,
        host_uid=host_uid,
        address=address,
        sequence=1,
        interval_ms=60_000,
        registrations=[held],
    )
    if invoke_address is not None:
        beat.invoke_address = invoke_address
    await gateway.routes.apply(beat, peer=Identity.host(runtime="python", host_id=host_id))


# The record file of a function that records each invocation's tag, and the function.
Recorded = tuple[Path, Function]


@pytest.fixture
async def recorded(gateway: Gateway, main_host: HostProcess, records_dir: Path) -> Recorded:
    """RECORDED on the main host (`recording`): its record file and the function."""
    return await recording(main_host, gateway, records_dir, RECORDED)


async def test_503_route_stale_when_the_host_fence_refuses_and_the_route_is_dropped(
    gateway: Gateway, client: aiohttp.ClientSession, main_host: HostProcess, recorded: Recorded, pki: TestPKI
) -> None:
    path, fn = recorded
    await wait_route(gateway, fn.uid)
    # The gateway believes the host holds a newer attempt than it does (a snapshot claiming
    # attempt 2, signed for this host): the host's fence refuses the request, which never runs.
    await _claim(gateway, pki, fn, attempt=2, host=(main_host.host_id, main_host.host_uid, main_host.address))
    stale = gateway.routes.route(fn.uid)
    assert stale is not None and stale.attempt == 2
    answer = await invoke(client, gateway, fn.uid, {"tag": "stale"})
    check_error(answer, 503, "RouteStale")
    retry_after(answer)
    assert gateway.routes.route(fn.uid) is None or gateway.routes.route(fn.uid) != stale  # dropped
    await reassigned(gateway, client, main_host, path, fn, attempt=2)


async def reassigned(
    gateway: Gateway,
    client: aiohttp.ClientSession,
    host: HostProcess,
    path: Path,
    fn: Function,
    *,
    attempt: int,
) -> None:
    """Once the gateway has routed `attempt` of a Run, the host's earlier attempt is never routed
    again, even from the host's next heartbeats: `fn` is registered at `attempt` on `host`, and
    the next invocation is the first the function (recording into `path`) runs."""
    renewals: list[float] = []

    def beaten() -> bool:  # the host's entry is renewed by each beat it sends
        entry = gateway.routes._hosts.get(host.host_uid)  # (no public view of one host's entry)
        if entry is not None and (not renewals or renewals[-1] != entry.expires):
            renewals.append(entry.expires)
        return len(renewals) > 2

    await wait_for(beaten, f"two heartbeats of {host.host_id}")  # both holding the earlier attempt
    assert gateway.routes.route(fn.uid) is None
    await host.register(gateway, RECORDED, env={"TEST_RECORD": str(path)}, uid=fn.uid, attempt=attempt)
    route = gateway.routes.route(fn.uid)
    assert route is not None and (route.attempt, route.host_uid) == (attempt, host.host_uid)
    assert (await invoke(client, gateway, fn.uid, {"tag": "real"})).expect(200).json["outputs"] == {
        "slept": 0
    }
    assert lines(path) == ["real"]


async def test_503_owner_unavailable_when_another_host_answers_at_the_routes_address(
    gateway: Gateway, client: aiohttp.ClientSession, main_host: HostProcess, recorded: Recorded, pki: TestPKI
) -> None:
    path, fn = recorded
    real = await wait_route(gateway, fn.uid)
    # Host "ghost" holds a genuine newer assignment of this Run, but its beat names the real
    # host's invoke port: the gateway expects the ghost's certificate there, finds the real host's
    # and sends nothing — 503, safe to retry, and the function never ran.
    ghost_uid = str(uuid.uuid4())
    assert real.invoke_address
    ghost = ("ghost", ghost_uid, main_host.address)
    await _claim(gateway, pki, fn, attempt=2, host=ghost, invoke_address=real.invoke_address)
    try:
        stale = gateway.routes.route(fn.uid)
        assert stale is not None and stale.host_uid == ghost_uid and stale.attempt == 2
        answer = await invoke(client, gateway, fn.uid, {"tag": "ghost"})
        check_error(answer, 503, "OwnerUnavailable")
        retry_after(answer)
        assert lines(path) == []
    finally:
        gateway.routes.forget(ghost_uid)
    await reassigned(gateway, client, main_host, path, fn, attempt=2)


async def test_503_owner_unavailable_when_the_owner_refuses_the_connection(
    gateway: Gateway, client: aiohttp.ClientSession, hosts: Hosts, records_dir: Path
) -> None:
    # a long interval: the route outlives the host long enough to be tried
    doomed = await hosts.start("gw-refused", interval_s=10.0)
    path, fn = await recording(doomed, gateway, records_dir, RECORDED)
    (await invoke(client, gateway, fn.uid, {"tag": "first"})).expect(200)
    doomed.signal(signal.SIGKILL)  # no `leaving`: its route stays until it expires
    assert await doomed.exited(10)
    route = gateway.routes.route(fn.uid)
    assert route is not None and route.host_uid == doomed.host_uid
    answer = await invoke(client, gateway, fn.uid, {"tag": "refused"})
    check_error(answer, 503, "OwnerUnavailable")
    assert retry_after(answer) >= 1
    assert lines(path) == ["first"]


# -- 429 ------------------------------------------------------------------------------------------


async def test_429_while_the_one_invocation_runs(
    gateway: Gateway, client: aiohttp.ClientSession, main_host: HostProcess, records_dir: Path
) -> None:
    path, fn = await recording(main_host, gateway, records_dir, RECORDED)
    first = asyncio.create_task(invoke(client, gateway, fn.uid, {"tag": "first", "sleep": 1.0}))
    await wait_for(lambda: lines(path) == ["first"], "the first invocation to start")
    answer = await invoke(client, gateway, fn.uid, {"tag": "second"})
    check_error(answer, 429, "FunctionBusy")
    retry_after(answer)
    (await first).expect(200)
    # free again once it is done; the refused one never ran
    (await invoke(client, gateway, fn.uid, {"tag": "third"})).expect(200)
    assert lines(path) == ["first", "third"]


# -- 413 ------------------------------------------------------------------------------------------


async def test_413_for_a_body_over_1_mib_with_content_length(
    gateway: Gateway, client: aiohttp.ClientSession, main_host: HostProcess
) -> None:
    fn = await main_host.register(gateway, SIZE)
    exactly = b'"' + b"x" * (MAX_PAYLOAD_BYTES - 2) + b'"'
    answer = await invoke(client, gateway, fn.uid, io.BytesIO(exactly))
    assert answer.sent["Content-Length"] == str(MAX_PAYLOAD_BYTES)
    assert answer.expect(200).json["outputs"] == {"length": MAX_PAYLOAD_BYTES}

    over = b'"' + b"x" * (MAX_PAYLOAD_BYTES - 1) + b'"'
    answer = await invoke(client, gateway, fn.uid, io.BytesIO(over))
    assert answer.sent["Content-Length"] == str(MAX_PAYLOAD_BYTES + 1)
    check_error(answer, 413, "PayloadTooLarge")


async def _refused_early(
    client: aiohttp.ClientSession, url: str, *, declared: int | None
) -> tuple[Answer, bool, int]:
    """Send a bit over 1 MiB, then hold the rest of the body back until the gateway has answered
    (at most 10 s). Returns the answer, whether it came before the rest, and the bytes sent."""
    answered = asyncio.Event()
    sent = 0
    early = True
    chunk = b"x" * 65536

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent, early
        while sent <= MAX_PAYLOAD_BYTES + len(chunk):
            sent += len(chunk)
            yield chunk
        try:
            await asyncio.wait_for(answered.wait(), 10)
        except TimeoutError:
            early = False  # the gateway was waiting for the rest: it would read the body whole

    headers = {"Authorization": f"Bearer {ALICE}"}
    if declared is not None:
        headers["Content-Length"] = str(declared)
    async with client.post(url, data=body(), headers=headers) as response:
        answered.set()
        answer = Answer(
            response.status,
            dict(response.headers),
            await response.read(),
            dict(response.request_info.headers),
        )
    return answer, early, sent


async def test_413_is_answered_before_the_body_is_read_whole(
    gateway: Gateway, client: aiohttp.ClientSession, echo: Function
) -> None:
    url = invoke_url(gateway, echo.uid)
    # chunked: refused once more than 1 MiB has streamed in
    answer, early, sent = await _refused_early(client, url, declared=None)
    assert answer.sent.get("Transfer-Encoding") == "chunked"
    check_error(answer, 413, "PayloadTooLarge")
    assert early and sent < 2 * MAX_PAYLOAD_BYTES
    # a declared Content-Length of 64 MiB: refused from the headers alone
    answer, early, sent = await _refused_early(client, url, declared=64 * MAX_PAYLOAD_BYTES)
    assert answer.sent.get("Content-Length") == str(64 * MAX_PAYLOAD_BYTES)
    check_error(answer, 413, "PayloadTooLarge")
    assert early


# -- 400 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "invocation_id",
    ["i" * (MAX_INVOCATION_ID_BYTES + 1), "é" * 65, "tab\there", "inv\u202e1", "é"],
    ids=["129-bytes", "130-utf8-bytes", "tab", "right-to-left-override", "not-ascii"],
)
async def test_400_for_a_bad_invocation_id(
    gateway: Gateway, client: aiohttp.ClientSession, echo: Function, invocation_id: str
) -> None:
    answer = await invoke(client, gateway, echo.uid, headers={INVOCATION_HEADER: invocation_id})
    assert answer.status == 400
    doc = answer.json
    assert doc["reason"] == "InvalidInvocationId"
    # a bad id is never echoed; the answer still names the field (empty: there is no valid id)
    assert "invocationId" in doc and doc["invocationId"] != invocation_id
    assert answer.headers.get(INVOCATION_HEADER) in (None, doc["invocationId"])


@pytest.mark.parametrize("body", [b"{", b"not json", b'{"a": 1', b"\xff\xfe", b"[" * 100_000], ids=repr)
async def test_400_for_malformed_json(
    gateway: Gateway, client: aiohttp.ClientSession, echo: Function, body: bytes
) -> None:
    answer = await invoke(client, gateway, echo.uid, body, headers={INVOCATION_HEADER: "inv-bad-json"})
    assert check_error(answer, 400, "MalformedJSON")["invocationId"] == "inv-bad-json"


@pytest.mark.parametrize(
    "timeout",
    ["abc", "0", "-1", "nan", "inf", "1e9", "", "1_0", "\u0661\u0660", "\uff11\uff10", "infinity", "0x10"],
    ids=repr,
)
async def test_400_for_a_timeout_that_is_not_ascii_seconds_in_bounds(
    gateway: Gateway, client: aiohttp.ClientSession, echo: Function, timeout: str
) -> None:
    answer = await invoke(client, gateway, echo.uid, headers={TIMEOUT_HEADER: timeout})
    check_error(answer, 400, "InvalidTimeout")


# -- 500: the gateway's own bug ------------------------------------------------------------------


class BuggyAuthorizer:
    """Fails where nothing expects a failure: stands in for a bug in the gateway's own code."""

    async def authorize(self, token: str, resource: Resource) -> Principal:
        raise ZeroDivisionError("a bug")

    async def close(self) -> None:
        return None


async def test_500_when_the_gateway_itself_fails(
    tls: TlsFiles, client: aiohttp.ClientSession, log_capture: LogCapture, pki: TestPKI
) -> None:
    """A 500 InternalError, logged with its traceback; never a 502, which would blame the owner."""
    buggy = Gateway(
        local_gateway_options(
            tls,
            authorizer=BuggyAuthorizer(),
            peer_tls=pki.gateway,
            assignments=pki.verifier(),
        )
    )
    seen = len(log_capture.records)
    await buggy.start()
    try:
        answer = await invoke(client, buggy, str(uuid.uuid4()), headers={INVOCATION_HEADER: "inv-bug"})
        doc = check_error(answer, 500, "InternalError")
        assert doc["invocationId"] == "inv-bug"
        assert "a bug" not in doc["message"]  # the exception's text stays in the log
    finally:
        await buggy.stop()
    logged = [r for r in log_capture.records[seen:] if r.getMessage() == "unexpected error"]
    assert len(logged) == 1 and logged[0].exc_info is not None
    assert logged[0].exc_info[0] is ZeroDivisionError


# -- 502 / 504: after dispatch, never retried ----------------------------------------------------


async def test_502_when_the_handler_ends_its_process(
    gateway: Gateway, client: aiohttp.ClientSession, main_host: HostProcess, records_dir: Path
) -> None:
    path, fn = await recording(main_host, gateway, records_dir, EXITS)
    answer = await invoke(client, gateway, fn.uid, headers={INVOCATION_HEADER: "inv-exit"})
    assert check_error(answer, 502, "FunctionProcessExited")["invocationId"] == "inv-exit"
    assert lines(path) == ["run"]


async def test_502_when_the_host_dies_during_the_invocation(
    gateway: Gateway, client: aiohttp.ClientSession, hosts: Hosts, records_dir: Path
) -> None:
    doomed = await hosts.start("gw-doomed")
    path, fn = await recording(doomed, gateway, records_dir, RECORDED)
    children = descendants(doomed.pid)
    assert children
    # It would sleep past this test's own timeout: only its host's death can end the call (how
    # soon the gateway tells is a number for a bench).
    call = asyncio.create_task(invoke(client, gateway, fn.uid, {"sleep": 3600}))
    await wait_for(lambda: lines(path) == ["run"], "the invocation to start")
    doomed.signal(signal.SIGKILL)
    answer = await call
    check_error(answer, 502, "OwnerUnreachable")
    assert lines(path) == ["run"]
    assert await doomed.exited(5)
    # its zygote and function process die with it
    await wait_for(lambda: not any(alive(pid) for pid in children), "the host's children to die", 5)


async def test_504_when_the_invocation_times_out(
    gateway: Gateway, client: aiohttp.ClientSession, main_host: HostProcess, records_dir: Path
) -> None:
    path, fn = await recording(main_host, gateway, records_dir, RECORDED)
    # It would sleep past this test's own timeout: only the invocation's timeout can end the call
    # (how close to its 0.5 s the answer comes is a number for a bench).
    answer = await invoke(
        client, gateway, fn.uid, {"tag": "slow", "sleep": 3600}, headers={TIMEOUT_HEADER: "0.5"}
    )
    check_error(answer, 504, "InvocationTimeout")
    assert lines(path) == ["slow"]
    # the killed warm process is replaced; the function serves again
    (await invoke(client, gateway, fn.uid, {"tag": "next"})).expect(200)
    assert lines(path) == ["slow", "next"]


# -- the rest of the HTTP surface -----------------------------------------------------------------


async def test_plain_http_to_the_https_port_gets_no_http_answer(gateway: Gateway) -> None:
    host, port = gateway.url.removeprefix("https://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n")
        await writer.drain()
        received = b""
        with contextlib.suppress(ConnectionError):
            received = await asyncio.wait_for(reader.read(65536), 10)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    assert not received.startswith(b"HTTP/")
    assert b"ok" not in received
    # and through an HTTP client: the connection fails, no status at all
    async with aiohttp.ClientSession() as plain:
        with pytest.raises(aiohttp.ClientError):
            async with plain.get(f"http://{host}:{port}/healthz") as response:
                await response.read()


async def test_health_readiness_metrics_and_openapi(
    gateway: Gateway, client: aiohttp.ClientSession, echo: Function
) -> None:
    (await invoke(client, gateway, echo.uid)).expect(200)
    check_error(await invoke(client, gateway, echo.uid, token=BOGUS), 401, "Unauthenticated")

    async with client.get(f"{gateway.url}/healthz") as response:
        assert response.status == 200 and await response.json() == {"status": "ok"}
    async with client.get(f"{gateway.url}/readyz") as response:
        doc = await response.json()
        assert response.status == 200 and doc["status"] == "ready"
        assert doc["routes"] >= 1 and doc["hosts"] >= 1
    async with client.get(f"{gateway.url}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    samples = [line for line in text.splitlines() if line.startswith("krt_gateway_requests_total{")]
    assert any('route="invoke"' in s and 'status="200"' in s for s in samples), samples
    assert any('route="invoke"' in s and 'reason="Unauthenticated"' in s for s in samples), samples
    assert not [uid for uid in REGISTERED if uid in text]
    assert not leaked_tokens([text])
    async with client.get(f"{gateway.url}/openapi.json") as response:
        assert response.status == 200
        spec = json.loads(await response.read())
    assert spec == openapi.document()
    assert "post" in spec["paths"]["/v1/namespaces/{namespace}/runtimes/{runtime}/functions/{uid}:invoke"]


async def test_unknown_paths_and_methods_get_json_answers(
    gateway: Gateway, client: aiohttp.ClientSession
) -> None:
    async with client.get(f"{gateway.url}/nowhere") as response:
        assert response.status == 404
        assert (await response.json())["reason"] == "NotFound"
    async with client.get(invoke_url(gateway, str(uuid.uuid4()))) as response:
        assert response.status == 405
        assert (await response.json())["reason"] == "MethodNotAllowed"


async def test_an_oversized_authorization_header_is_refused_without_logging_it(
    gateway: Gateway, client: aiohttp.ClientSession, echo: Function, log_capture: LogCapture
) -> None:
    seen = len(log_capture.lines)
    for token in SECRETS:
        answer = await invoke(client, gateway, echo.uid, token=token + "x" * 9000)
        assert answer.status == 400  # aiohttp's own answer: the header line is too long
    assert not leaked_tokens(log_capture.lines[seen:])
    (await invoke(client, gateway, echo.uid)).expect(200)
