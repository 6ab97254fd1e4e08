"""The real attempt_invocation under InvocationWorkflow on the real Temporal dev server (#44): by
the time its request reaches the gateway (a scripted GatewayDispatch server on loopback, mTLS with
the test CA), the server already holds ATTEMPT_SENT as the attempt's heartbeat details, which is
what lets the workflow read a timeout without them as never run."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from kruntimes.activities.invocations import InvocationAttempts
from kruntimes.contracts.invocation import (
    ATTEMPT_SENT,
    QUERY_INVOCATION,
    InvocationState,
    InvocationStatus,
    invocation_workflow_id,
)
from kruntimes.rpc.v1 import gateway_dispatch_pb2 as gd
from kruntimes.rpc.v1 import gateway_dispatch_pb2_grpc as gd_grpc
from kruntimes.workflows.invocation import InvocationWorkflow
from tests.support.pki import TestPKI
from tests.support.waiting import eventually
from tests.workflows.invocations import StandIns, new_input, start


class Gateway(gd_grpc.GatewayDispatchServicer):
    """Answers Succeeded, having read the attempt's heartbeat details off the server first."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.details: list[list[Any]] = []

    async def AttemptInvocation(
        self, request: gd.AttemptInvocationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> gd.AttemptInvocationResponse:
        workflow_id = invocation_workflow_id(request.namespace, request.target_uid, request.invocation_id)
        described = await self.client.get_workflow_handle(workflow_id).describe()
        for pending in described.raw_description.pending_activities:
            payloads = list(pending.heartbeat_details.payloads)
            self.details.append(await self.client.data_converter.decode(payloads))
        body = b'{"invocationId": "i", "status": "Succeeded", "outputs": null}'
        return gd.AttemptInvocationResponse(http_status=200, body=body, dispatched=True)


@pytest.fixture
async def gateway(client: Client, pki: TestPKI) -> AsyncIterator[tuple[Gateway, str]]:
    servicer = Gateway(client)
    server = grpc.aio.server()
    gd_grpc.add_GatewayDispatchServicer_to_server(servicer, server)
    port = server.add_secure_port("127.0.0.1:0", pki.gateway.server_credentials())
    await server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


async def test_the_server_holds_the_mark_before_the_gateway_gets_the_attempt(
    client: Client, gateway: tuple[Gateway, str]
) -> None:
    servicer, address = gateway
    standins = StandIns()
    attempts = InvocationAttempts([address])
    queue = f"invocations-marking-{uuid.uuid4().hex[:8]}"
    try:
        async with Worker(
            client,
            task_queue=queue,
            workflows=[InvocationWorkflow],
            activities=[standins.invocation_target, standins.deliver_callback, attempts.attempt_invocation],
        ):
            handle = await start(client, queue, new_input())
            status = await eventually(
                lambda: handle.query(QUERY_INVOCATION, result_type=InvocationStatus),
                until=lambda s: s.state not in (InvocationState.Queued, InvocationState.Running),
                what="the invocation ends",
            )
            await handle.terminate("the test read its status")  # kept for its retention otherwise
    finally:
        await attempts.close()
    assert status.state is InvocationState.Succeeded, status
    assert servicer.details == [[ATTEMPT_SENT]], "the mark was the server's before the request came"
