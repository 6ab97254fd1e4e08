"""Async invocations under real faults (issue #44), on the shared platform (the Temporal dev
server, the worker, the HTTPS gateway, real runtime hosts): what provably did not run is retried
and runs once (429 from a busy Run; a refused connection to the host's invoke port), what may have
run is not (a host SIGKILLed mid-call: Unknown) unless the target declares it may be
(`retry.onUnknownOutcome`); a Run that ends fails the invocations waiting for it (TargetGone); past
the target's `asyncInvocations.backlog` an invocation is 429 and not recorded; the callback is
delivered signed and delivered again after the receiver failed; sync invokes are
answered while async ones hold the target's share. The function appends its invocation id to a
file for every call: "once" is what the function saw, not what the API says."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import secrets
import signal
import ssl
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from kruntimes.activities.callbacks import AllowedHost, CallbackPolicy
from kruntimes.activities.hosts.process import list_records
from kruntimes.api.run import Run
from kruntimes.config import secret_store
from kruntimes.sdk.callbacks import SIGNATURE_HEADER, verify
from kruntimes.sdk.client import AsyncBacklogFull, Client, Invocation, InvocationNotFound, RunObject
from tests.activities.callbacks_test import Certs, certs  # noqa: F401 - the receiver's CA, a fixture
from tests.sdk.stack import Platform, manifest, unique
from tests.support.isolation import require_or_skip
from tests.support.waiting import eventually

# Appends its invocation id to p['log'] for each call; then, with p['gate'], waits (bounded) until
# that file exists — on every call, or with p['first'] only on the first call the log holds.
GATED = """\
import os, time

def handle(p, context):
    with open(p['log'], 'a') as f:
        f.write(context.invocation_id + '\\n')
    gate = p.get('gate')
    if gate and (not p.get('first') or len(open(p['log']).read().splitlines()) == 1):
        deadline = time.monotonic() + 120
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.01)
    return {'n': p.get('n')}
"""
WAIT_S = 90.0


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@dataclasses.dataclass
class Exchange:
    """A directory the functions see: the call log and the gate the test opens."""

    log: Path
    gate: Path

    def open(self) -> None:
        self.gate.write_text("open")

    def body(self, **more: Any) -> dict[str, Any]:
        return {"log": str(self.log), **more}

    def gated(self, **more: Any) -> dict[str, Any]:
        return self.body(gate=str(self.gate), **more)


@pytest.fixture
def exchange(platform: Platform) -> Iterator[Exchange]:
    where = platform.shared / unique("afault")
    where.mkdir()
    where.chmod(0o1777)
    made = Exchange(where / "calls", where / "gate")
    # made here, writable by all: a Run recovered onto a new host runs as another uid, which
    # could not append to a log its first uid made (nor, in a sticky directory, open it O_CREAT)
    made.log.touch()
    made.log.chmod(0o666)
    try:
        yield made
    finally:
        made.open()  # no function of this test left waiting


@pytest.fixture
async def krt(platform: Platform) -> AsyncIterator[Client]:
    async with Client(platform.config) as client:
        yield client


async def _run(krt: Client, *, function: dict[str, Any] | None = None, name: str = "") -> RunObject:
    name = name or unique("afault")
    await krt.create(Run.from_dict(manifest(name, source=GATED, mode={"function": function or {}})))
    return await krt.wait(name, timeout=60)


async def _status(krt: Client, run: RunObject, inv: str) -> Invocation:
    return await krt.invocations.get(run.metadata.name, inv)


def _attempts(done: Invocation) -> list[tuple[int, str, bool]]:
    return [(a.httpStatus, a.reason, a.dispatched) for a in done.attempts]


def _host_pid(platform: Platform, run: RunObject) -> int:
    assert run.status is not None and run.status.assignedHostUID
    [record] = [r for r in list_records(platform.state_dir) if r.hostUid == run.status.assignedHostUID]
    assert record.pid is not None
    return record.pid


async def test_an_invocation_refused_429_by_a_busy_run_is_retried_and_runs_once_after(
    krt: Client, exchange: Exchange
) -> None:
    run = await _run(krt, function={"concurrency": 1})  # no queue: a second call is 429 FunctionBusy
    holding = asyncio.create_task(krt.invoke(run, exchange.gated(n=0), timeout=60))
    await eventually(lambda: len(_calls(exchange.log)) == 1, what="the sync call running")
    inv = f"busy-{uuid.uuid4().hex[:8]}"
    await krt.invoke_async(run, exchange.body(n=1), invocation_id=inv)

    async def refused() -> bool:
        return any(a[0] == 429 for a in _attempts(await _status(krt, run, inv)))

    await eventually(refused, within=WAIT_S, what="an attempt refused 429 while the Run is busy", every=0.1)
    exchange.open()
    assert (await holding).ok
    done = await krt.invocations.wait(run.metadata.name, inv, timeout=WAIT_S)
    assert done.state.value == "Succeeded" and done.retried == "notRun", done
    attempts = _attempts(done)
    assert attempts[0] == (429, "FunctionBusy", False) and attempts[-1][0] == 200, attempts
    assert all(not dispatched for _, _, dispatched in attempts[:-1]), attempts
    assert _calls(exchange.log).count(inv) == 1, "it ran once, after the Run was free"


@contextlib.contextmanager
def _refused(port: int) -> Iterator[None]:
    """New TCP connections to 127.0.0.1:`port` refused (a RST answers the SYN: a real packet rule
    in a table of this test's own), and the connections open to it now destroyed."""
    table = f"krt_async_{uuid.uuid4().hex[:8]}"
    rules = (
        f"table inet {table} {{ chain out {{ type filter hook output priority 0; policy accept; "
        f"ip daddr 127.0.0.1 tcp dport {port} tcp flags & (syn | ack) == syn reject with tcp reset; }}; }}"
    )
    added = subprocess.run(["nft", "-f", "-"], input=rules, capture_output=True, text=True, check=False)
    if added.returncode != 0:
        require_or_skip(f"cannot add a packet rule (nft): {added.stderr.strip()[:200]}")
    try:
        killed = subprocess.run(
            ["ss", "-K", "dst", "127.0.0.1", "dport", "=", f":{port}"],
            capture_output=True,
            text=True,
            check=False,
        )
        if killed.returncode != 0:
            require_or_skip(f"cannot destroy a socket (ss -K): {killed.stderr.strip()[:200]}")
        yield
    finally:
        subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True, check=True)


async def test_an_invocation_whose_host_refuses_the_connection_is_retried_and_runs_once(
    krt: Client, platform: Platform, exchange: Exchange
) -> None:
    if os.geteuid() != 0:
        require_or_skip("a packet rule needs root")
    run = await _run(krt)
    route = platform.gateway.routes.route(run.uid)
    assert route is not None and route.invoke_address, "the gateway reaches the host's invoke port"
    port = int(route.invoke_address.rpartition(":")[2])
    inv = f"refused-{uuid.uuid4().hex[:8]}"
    with _refused(port):
        await krt.invoke_async(run, exchange.body(n=2), invocation_id=inv)

        async def refused() -> bool:
            return any(a[:2] == (503, "OwnerUnavailable") for a in _attempts(await _status(krt, run, inv)))

        await eventually(
            refused, within=WAIT_S, what="an attempt refused at the host's invoke port", every=0.1
        )
        assert _calls(exchange.log) == [], "nothing ran while the host could not be reached"
    done = await krt.invocations.wait(run.metadata.name, inv, timeout=WAIT_S)
    assert done.state.value == "Succeeded" and done.retried == "notRun", done
    attempts = _attempts(done)
    assert attempts[0] == (503, "OwnerUnavailable", False) and attempts[-1][0] == 200, attempts
    assert _calls(exchange.log) == [inv], "it ran once, once the host could be reached"


@pytest.mark.parametrize("idempotent", [False, True], ids=["not-retried", "onUnknownOutcome"])
async def test_a_host_killed_mid_call_leaves_it_unknown_unless_the_target_declares_it_idempotent(
    krt: Client, platform: Platform, exchange: Exchange, idempotent: bool
) -> None:
    policy = {"asyncInvocations": {"retry": {"onUnknownOutcome": True}}} if idempotent else {}
    run = await _run(krt, function=policy)
    inv = f"killed-{uuid.uuid4().hex[:8]}"
    await krt.invoke_async(run, exchange.gated(first=True), invocation_id=inv)
    await eventually(lambda: _calls(exchange.log) == [inv], within=WAIT_S, what="the call running")
    os.kill(_host_pid(platform, run), signal.SIGKILL)  # a host this test's platform started
    done = await krt.invocations.wait(run.metadata.name, inv, timeout=WAIT_S)
    first = _attempts(done)[0]
    assert first[2] and first[0] in (502, 504), f"the first attempt may have run: {first}"
    if idempotent:
        assert done.state.value == "Succeeded" and done.retried == "unknownOutcome", done
        assert _calls(exchange.log) == [inv, inv], "retried as declared: it ran again"
    else:
        assert done.state.value == "Unknown" and done.attemptCount == 1, done
        assert done.error is not None and "onUnknownOutcome" in done.error.message, done.error
        assert _calls(exchange.log) == [inv], "not retried: it ran once"


async def test_a_run_that_ends_fails_the_invocations_waiting_for_it_target_gone(
    krt: Client, exchange: Exchange
) -> None:
    run = await _run(krt, function={"concurrency": 1})
    holding = asyncio.create_task(krt.invoke(run, exchange.gated(), timeout=60))
    await eventually(lambda: len(_calls(exchange.log)) == 1, what="the sync call running")
    waiting = [await krt.invoke_async(run, exchange.body(n=n)) for n in range(3)]

    async def all_refused() -> bool:
        read = [await krt.invocations.get(a) for a in waiting]
        return all(i.state.value == "Queued" and i.attemptCount >= 1 for i in read)

    await eventually(all_refused, within=WAIT_S, what="each invocation refused once and waiting", every=0.1)
    await krt.delete(run.metadata.name)
    exchange.open()
    with contextlib.suppress(Exception):  # the sync call's own answer is not this test's concern
        await holding
    ended = [await krt.invocations.wait(a, timeout=WAIT_S) for a in waiting]
    assert [(i.state.value, i.error.reason if i.error else "") for i in ended] == [
        ("Failed", "TargetGone")
    ] * 3, ended
    assert len(_calls(exchange.log)) == 1, "none of the waiting invocations ran"


async def test_past_the_targets_backlog_an_invocation_is_refused_429_async_backlog_full(
    krt: Client, exchange: Exchange
) -> None:
    run = await _run(krt, function={"concurrency": 1, "asyncInvocations": {"backlog": 2}})
    holding = asyncio.create_task(krt.invoke(run, exchange.gated(), timeout=60))
    await eventually(lambda: len(_calls(exchange.log)) == 1, what="the sync call running")
    queued = [await krt.invoke_async(run, exchange.body(n=n)) for n in range(2)]
    refused = f"past-{uuid.uuid4().hex[:8]}"
    try:
        with pytest.raises(AsyncBacklogFull) as full:
            await krt.invoke_async(run, exchange.body(n=3), invocation_id=refused)
        assert full.value.status == 429 and full.value.retry_after > 0
        with pytest.raises(InvocationNotFound):
            await krt.invocations.get(run.metadata.name, refused)
    finally:
        exchange.open()
        await holding
    ended = [await krt.invocations.wait(accepted, timeout=WAIT_S) for accepted in queued]
    assert all(i.ok for i in ended), "the two within the backlog ran"
    assert len(_calls(exchange.log)) == 3 and refused not in _calls(exchange.log)


async def test_sync_invokes_are_answered_while_async_invocations_hold_their_share(
    krt: Client, exchange: Exchange
) -> None:
    run = await _run(krt, function={"concurrency": 4})  # the async share (50 %): 2 at once
    backlog = [await krt.invoke_async(run, exchange.gated(n=n)) for n in range(8)]
    await eventually(lambda: len(_calls(exchange.log)) == 2, within=WAIT_S, what="two async calls running")

    async def refused_their_turn() -> bool:
        read = [await krt.invocations.get(a) for a in backlog]
        return sum(any(a.reason == "AsyncShareFull" for a in i.attempts) for i in read) >= 6

    await eventually(refused_their_turn, within=WAIT_S, what="the rest refused AsyncShareFull", every=0.1)
    answered = [await krt.invoke(run, exchange.body(n=100 + n), timeout=30) for n in range(3)]
    assert all(a.ok for a in answered), answered
    read = [await krt.invocations.get(a) for a in backlog]
    assert sum(not i.done for i in read) == 8, "the sync calls were answered while all 8 waited or ran"
    assert len(_calls(exchange.log)) == 2 + 3, "no third async call took a sync caller's place"
    exchange.open()
    ended = [await krt.invocations.wait(a, timeout=WAIT_S) for a in backlog]
    assert all(i.ok for i in ended), [i.state for i in ended]
    ran = _calls(exchange.log)
    assert sorted(ran.count(a.invocationId) for a in backlog) == [1] * 8, "each async one ran once"


# --- callbacks -------------------------------------------------------------------------------------

HOOK_SECRET = "hook-key"
IDENTITY = "hook-owner"


@dataclasses.dataclass
class Receiver:
    """An HTTPS receiver on 127.0.0.1 that answers 500 to its first `failing` requests, then 204."""

    port: int = 0
    failing: int = 1
    requests: list[tuple[dict[str, str], bytes]] = dataclasses.field(default_factory=list)


async def _receive(receiver: Receiver, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        _, *fields = head.decode("latin-1").split("\r\n")
        got = {k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields if f)}
        body = await reader.readexactly(int(got.get("content-length", "0")))
        receiver.requests.append((got, body))
        if len(receiver.requests) <= receiver.failing:
            writer.write(
                b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\nConnection: close\r\n\r\nboom"
            )
        else:
            writer.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
        await writer.drain()
    except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


@pytest.fixture
async def receiver(certs: Certs) -> AsyncIterator[Receiver]:  # noqa: F811 - the imported fixture
    made = Receiver()
    server = await asyncio.start_server(lambda r, w: _receive(made, r, w), "127.0.0.1", 0, ssl=certs.server)
    made.port = server.sockets[0].getsockname()[1]
    async with server:
        yield made


@pytest.fixture
async def callbacks_allowed(platform: Platform, certs: Certs) -> AsyncIterator[bytes]:  # noqa: F811
    """The platform's worker started again as `krt worker --callback-allow 127.0.0.1 --callback-ca`
    (the receiver's CA), its namespace's Secret HOOK_SECRET, and IDENTITY bound to use it; all as
    they were afterwards. Yields the Secret's key."""
    key = secrets.token_hex(16).encode()
    secret_store.create(platform.state_dir, namespace="default", name=HOOK_SECRET, values={"key": key})
    bindings = platform.state_dir / "rolebindings.yaml"
    assert not bindings.exists(), "another module's role bindings are in place"
    bindings.write_text(
        "bindings:\n- namespace: default\n  verbs: [use-secrets]\n"
        f"  users: [{IDENTITY}]\n  secrets: [{HOOK_SECRET}]\n"
    )
    bindings.chmod(0o644)
    workers = platform.workers
    before = workers.settings
    await workers.__aexit__(None, None, None)
    workers.settings = dataclasses.replace(
        before, callbacks=CallbackPolicy(allow=(AllowedHost.parse("127.0.0.1"),), ca_file=certs.ca)
    )
    await workers.__aenter__()
    try:
        yield key
    finally:
        await workers.__aexit__(None, None, None)
        workers.settings = before
        await workers.__aenter__()
        bindings.unlink()
        secret_store.delete(platform.state_dir, namespace="default", name=HOOK_SECRET)


async def test_the_callback_is_delivered_signed_and_delivered_again_after_the_receiver_failed(
    platform: Platform, exchange: Exchange, receiver: Receiver, callbacks_allowed: bytes
) -> None:
    url = f"https://127.0.0.1:{receiver.port}/hook"
    policy = {"asyncInvocations": {"callback": {"url": url, "secretName": HOOK_SECRET}}}
    async with Client(platform.config.model_copy(update={"identity": IDENTITY})) as owner:
        run = await _run(owner, function=policy)
        accepted = await owner.invoke_async(run, exchange.body(n=5))

        async def delivered() -> Invocation | None:
            read = await owner.invocations.get(accepted)
            return read if read.callback is not None and read.callback.delivered else None

        done = await eventually(delivered, within=WAIT_S, what="the callback delivered", every=0.1)
    assert done.ok and done.callback is not None
    assert done.callback.attempts == 2 and [f.reason for f in done.callback.failures] == ["HTTP500"], done
    assert len(receiver.requests) == 2, "one failed delivery, then one delivered"
    for got, body in receiver.requests:
        assert verify(got[SIGNATURE_HEADER.lower()], body, callbacks_allowed), "signed with the Secret"
        sent = json.loads(body)
        assert sent["invocationId"] == accepted.invocationId and sent["state"] == "Succeeded"
    assert not verify(receiver.requests[0][0][SIGNATURE_HEADER.lower()], b"{}", callbacks_allowed)
    assert _calls(exchange.log) == [accepted.invocationId], "a callback that failed ran nothing again"
