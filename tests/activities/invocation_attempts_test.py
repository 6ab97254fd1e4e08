"""attempt_invocation against real gRPC servers on loopback with the test CA's certificates (#44):
a GatewayDispatch server that answers as each test chose, a port that refuses connections, a
server that is not a gateway. What the activity may call `dispatched=False` (proven not run) and
what it must call `dispatched=True` (it may have run)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from temporalio.testing import ActivityEnvironment

from kruntimes.activities.invocations import GATEWAY_LOST, GATEWAY_UNREACHABLE, NO_GATEWAY, InvocationAttempts
from kruntimes.contracts.invocation import AttemptOutcome, AttemptRequest, Target, TargetKind
from kruntimes.pki import Identity
from kruntimes.rpc.v1 import gateway_dispatch_pb2 as gd
from kruntimes.rpc.v1 import gateway_dispatch_pb2_grpc as gd_grpc
from tests.support.pki import TestPKI
from tests.support.ports import refusing_port

HOLD_BOUND_S = 30.0  # the longest a held call waits to be released


@dataclass
class Scripted(gd_grpc.GatewayDispatchServicer):
    """Answers each call with the next of `answers`: a response, a status code to abort with, or
    "hold" (wait until released or cancelled); records every request."""

    answers: list[Any] = field(default_factory=list)
    asked: list[gd.AttemptInvocationRequest] = field(default_factory=list)
    holding: asyncio.Event = field(default_factory=asyncio.Event)

    async def AttemptInvocation(
        self, request: gd.AttemptInvocationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> gd.AttemptInvocationResponse:
        self.asked.append(request)
        answer = self.answers[min(len(self.asked), len(self.answers)) - 1]
        if isinstance(answer, grpc.StatusCode):
            await context.abort(answer, "scripted")
        if answer == "hold":
            self.holding.set()
            await asyncio.sleep(HOLD_BOUND_S)
        assert isinstance(answer, gd.AttemptInvocationResponse)
        return answer


@dataclass
class Served:
    address: str
    script: Scripted
    server: grpc.aio.Server


async def _serve(pki: TestPKI, *, identity: Any = None) -> Served:
    script = Scripted()
    server = grpc.aio.server()
    gd_grpc.add_GatewayDispatchServicer_to_server(script, server)
    tls = pki.gateway if identity is None else pki.peer(identity)
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials())
    await server.start()
    return Served(address=f"127.0.0.1:{port}", script=script, server=server)


@pytest.fixture
async def gateway(pki: TestPKI) -> AsyncIterator[Served]:
    served = await _serve(pki)
    try:
        yield served
    finally:
        await served.server.stop(grace=None)


@pytest.fixture
def refused() -> Any:
    with refusing_port() as port:
        yield f"127.0.0.1:{port}"


def request(*, attempt: int = 1, timeout: float | None = 5.0) -> AttemptRequest:
    return AttemptRequest(
        target=Target(
            kind=TargetKind.Run, namespace="demo", name="echo", uid=str(uuid.uuid4()), runtime="python"
        ),
        invocationId="order-17",
        body='{"n": 1}',
        timeoutSeconds=timeout,
        attempt=attempt,
        share=30,
    )


def ok(body: bytes = b'{"status":"Succeeded"}') -> gd.AttemptInvocationResponse:
    return gd.AttemptInvocationResponse(http_status=200, body=body, dispatched=True)


async def attempt(
    activities: InvocationAttempts, req: AttemptRequest, beats: list[Any] | None = None
) -> AttemptOutcome:
    env = ActivityEnvironment()
    if beats is not None:
        env.on_heartbeat = lambda *details: beats.append(details)
    outcome: AttemptOutcome = await env.run(activities.attempt_invocation, req)
    return outcome


async def test_the_gateways_answer_is_the_outcome_and_the_request_carries_the_attempt(
    gateway: Served,
) -> None:
    gateway.script.answers = [ok()]
    req = request(attempt=3)
    outcome = await attempt(InvocationAttempts([gateway.address]), req)
    assert outcome == AttemptOutcome(httpStatus=200, body='{"status":"Succeeded"}', dispatched=True)
    [sent] = gateway.script.asked
    assert (sent.namespace, sent.target_kind, sent.target_uid, sent.runtime) == (
        "demo",
        "Run",
        req.target.uid,
        "python",
    )
    assert (sent.invocation_id, sent.body, sent.timeout_ms, sent.attempt, sent.share_percent) == (
        "order-17",
        b'{"n": 1}',
        5000,
        3,
        30,
    )


async def test_a_refusal_before_dispatch_is_passed_on_as_not_dispatched(gateway: Served) -> None:
    gateway.script.answers = [gd.AttemptInvocationResponse(http_status=429, reason="AsyncShareFull")]
    outcome = await attempt(InvocationAttempts([gateway.address]), request(timeout=None))
    assert outcome == AttemptOutcome(httpStatus=429, reason="AsyncShareFull", dispatched=False)
    assert gateway.script.asked[0].timeout_ms == 0, "the gateway's default timeout"


async def test_a_refused_connection_is_not_dispatched(refused: str) -> None:
    outcome = await attempt(InvocationAttempts([refused]), request())
    assert outcome == AttemptOutcome(httpStatus=0, reason=GATEWAY_UNREACHABLE, dispatched=False)


async def test_no_gateway_configured_is_not_dispatched() -> None:
    outcome = await attempt(InvocationAttempts([]), request())
    assert (outcome.reason, outcome.dispatched) == (NO_GATEWAY, False)


async def test_a_gateway_not_reached_gives_way_to_the_next_and_attempts_take_turns(
    gateway: Served, refused: str
) -> None:
    gateway.script.answers = [ok()]
    activities = InvocationAttempts([refused, gateway.address])
    assert (await attempt(activities, request(attempt=1))).httpStatus == 200
    assert (await attempt(activities, request(attempt=2))).httpStatus == 200
    assert [a.attempt for a in gateway.script.asked] == [1, 2]


async def test_a_gateway_that_does_not_know_the_call_did_not_run_it(gateway: Served) -> None:
    gateway.script.answers = [grpc.StatusCode.UNIMPLEMENTED]
    outcome = await attempt(InvocationAttempts([gateway.address]), request())
    assert (outcome.reason, outcome.dispatched) == (GATEWAY_UNREACHABLE, False)


async def test_a_server_that_is_not_a_gateway_is_never_sent_the_invocation(pki: TestPKI) -> None:
    impostor = await _serve(pki, identity=Identity.host(runtime="python", host_id="python-0"))
    try:
        impostor.script.answers = [ok()]
        outcome = await attempt(InvocationAttempts([impostor.address], connect_timeout_s=1.0), request())
        assert (outcome.reason, outcome.dispatched) == (GATEWAY_UNREACHABLE, False)
        assert not impostor.script.asked
    finally:
        await impostor.server.stop(grace=None)


async def test_a_deadline_after_sending_may_have_run_and_it_heartbeats_meanwhile(gateway: Served) -> None:
    gateway.script.answers = ["hold"]
    beats: list[Any] = []
    outcome = await attempt(
        InvocationAttempts([gateway.address], answer_margin_s=0.5), request(timeout=0.5), beats
    )
    assert outcome == AttemptOutcome(httpStatus=0, reason=GATEWAY_LOST, dispatched=True)
    assert beats, "it heartbeats while it waits"


async def test_a_gateway_lost_mid_call_may_have_run_it(gateway: Served) -> None:
    gateway.script.answers = ["hold"]
    running = asyncio.create_task(attempt(InvocationAttempts([gateway.address]), request()))
    await asyncio.wait_for(gateway.script.holding.wait(), HOLD_BOUND_S)
    await gateway.server.stop(grace=None)
    outcome = await asyncio.wait_for(running, HOLD_BOUND_S)
    assert (outcome.reason, outcome.dispatched) == (GATEWAY_LOST, True)


async def test_gateways_that_never_finish_a_handshake_share_one_budget_and_get_nothing() -> None:
    """Five addresses that accept and then say nothing: each connect waits its bound, all of them
    within the attempt's one budget (timeout + margin), so not all five are even tried."""
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    servers = [await asyncio.start_server(silent, "127.0.0.1", 0) for _ in range(5)]
    try:
        addresses = [f"127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in servers]
        activities = InvocationAttempts(addresses, answer_margin_s=0.4, connect_timeout_s=0.3)
        outcome = await attempt(activities, request(timeout=0.2))
        assert outcome == AttemptOutcome(httpStatus=0, reason=GATEWAY_UNREACHABLE, dispatched=False)
        assert 1 <= len({w.get_extra_info("sockname") for w in accepted}) < len(servers)
    finally:
        for writer in accepted:
            writer.close()
        for server in servers:
            server.close()
            await server.wait_closed()
