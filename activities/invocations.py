"""InvocationWorkflow's side effects (issue #44; docs/async-invocations.md): reading its target,
and one attempt through a gateway.

`invocation_target` reads the Run's or the Function's workflow through the worker's Temporal
client: whether it exists and serves (its workflow runs, its KrtPhase), and its
spec.mode.function.asyncInvocations (a Run's from its workflow's input, kept per execution since
a Run's spec never changes; a Function's current revision from its `function` query).

`attempt_invocation` calls GatewayDispatch.AttemptInvocation on a gateway's heartbeat server over
mutual TLS with the control plane's certificate, as the autoscaler calls GatewayLoad: the
addresses the worker gives its hosts (`platform.gatewayHeartbeats`), tried from attempt to
attempt in turn. Each attempt opens its own channel and waits until it is connected before it
sends: a gateway that cannot be reached (or refuses the call before it reads it) is
`dispatched=False` and the next one is tried; once the request may have been sent, a deadline or
a lost connection is `dispatched=True` (its outcome is unknown). It heartbeats while it waits, so
a worker lost mid-attempt is seen by the workflow (as an outcome lost, never retried behind its
back). Asked to (`marksDispatch`), it sends only once the server holds ATTEMPT_SENT as its
heartbeat's details: an attempt whose activity timed out without them provably never ran (a
task started for a worker's poll whose answer never reached the worker, temporalio/temporal#11733),
and the workflow tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import grpc
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from kruntimes.activities.hosts._rpc import gateway_channel
from kruntimes.api.function import Function, FunctionPhase
from kruntimes.api.ids import Namespace
from kruntimes.api.limits import DEFAULT_INVOKE_TIMEOUT_SECONDS
from kruntimes.api.names import validate_dns1123_label
from kruntimes.api.phases import TERMINAL_PHASES, RunPhase
from kruntimes.api.run import Run
from kruntimes.api.spec import AsyncInvocations, Creator
from kruntimes.contracts.function import QUERY_FUNCTION
from kruntimes.contracts.invocation import (
    ACTIVITY_ATTEMPT,
    ACTIVITY_TARGET,
    ATTEMPT_SENT,
    MAX_RESULT_BYTES,
    AttemptOutcome,
    AttemptRequest,
    InvocationPolicy,
    Target,
    TargetKind,
)
from kruntimes.contracts.names import function_workflow_id, run_workflow_id
from kruntimes.contracts.run import RunInput
from kruntimes.rpc.v1 import gateway_dispatch_pb2 as gd
from kruntimes.rpc.v1 import gateway_dispatch_pb2_grpc as gd_grpc
from kruntimes.wire import search, search_typed

log = logging.getLogger(__name__)

RPC_TIMEOUT = timedelta(seconds=10)  # one read of Temporal (a describe, a query, a history page)
CONNECT_TIMEOUT_S = 5.0  # a gateway's TCP and TLS handshake
# Beyond the invocation's timeout: the gateway's own dispatch and the answer's way back (the
# workflow's start-to-close timeout is longer still).
ANSWER_MARGIN_S = 30.0
HEARTBEAT_EVERY_S = 5.0
HEARTBEAT_RPC_TIMEOUT = timedelta(seconds=5)  # one marking beat: well within the heartbeat timeout
MAX_REASON_CHARS = 128
MAX_CACHED_RUNS = 1024  # Run specs kept (immutable per execution)
# A gateway that answers these refused the call before reading it: the attempt did not run there.
NOT_READ = frozenset(
    {
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.INVALID_ARGUMENT,
    }
)
GATEWAY_UNREACHABLE = "GatewayUnreachable"
GATEWAY_LOST = "GatewayLost"
# The server did not confirm ATTEMPT_SENT (the activity timed out meanwhile, or the server did not
# answer): not sent, so not run.
SENT_NOT_RECORDED = "SentNotRecorded"
NO_GATEWAY = "NoGateway"
_ENDED = frozenset(p.value for p in TERMINAL_PHASES)

T = TypeVar("T")


def _first(description: WorkflowExecutionDescription, key: SearchAttributeKey[str]) -> str:
    return description.typed_search_attributes.get(key) or ""


def _policy(
    block: AsyncInvocations, *, exists: bool, ready: bool, creator: Creator | None, reason: str
) -> InvocationPolicy:
    callback = block.callback
    return InvocationPolicy(
        exists=exists,
        ready=ready,
        retry=block.retry,
        retentionSeconds=block.retentionSeconds,
        callbackUrl=callback.url if callback is not None else None,
        callbackSecretName=callback.secretName if callback is not None else None,
        creator=str(creator) if creator is not None else "",
        share=block.share,
        reason=reason,
    )


class InvocationTargets:
    """`invocation_target`, through the worker's Temporal client."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._runs: OrderedDict[tuple[str, str], Run] = OrderedDict()

    # -- the target ------------------------------------------------------------------------------

    @activity.defn(name=ACTIVITY_TARGET)
    async def invocation_target(self, target: Target) -> InvocationPolicy:
        try:
            validate_dns1123_label(target.namespace, field="target.namespace")
            if target.name:
                validate_dns1123_label(target.name, field="target.name")
        except ValueError as err:
            raise ApplicationError(str(err), type="InvalidTarget", non_retryable=True) from None
        if target.kind is TargetKind.Function:
            return await self._function(target)
        return await self._run(target)

    async def _rpc(self, call: Awaitable[T], what: str) -> T:
        try:
            return await call
        except RPCError as err:
            raise ApplicationError(f"{what}: {err.status.name}", type="TargetUnreadable") from None

    async def _described(
        self, workflow_id: str, attribute: SearchAttributeKey[str], uid: str
    ) -> WorkflowExecutionDescription | None:
        """The execution of `workflow_id` if it is the target's (its `attribute` is `uid`)."""
        handle = self.client.get_workflow_handle(workflow_id)
        try:
            described = await handle.describe(rpc_timeout=RPC_TIMEOUT)
        except RPCError as err:
            if err.status is RPCStatusCode.NOT_FOUND:
                return None
            raise ApplicationError(
                f"describe {workflow_id}: {err.status.name}", type="TargetUnreadable"
            ) from None
        return described if _first(described, attribute) == uid else None

    async def _listed(self, query: str) -> WorkflowExecutionDescription | None:
        """The first running execution `query` lists (else the latest closed one), described."""
        found: list[tuple[bool, str, str]] = []

        async def collect() -> None:
            async for execution in self.client.list_workflows(query, limit=10, rpc_timeout=RPC_TIMEOUT):
                running = execution.status == WorkflowExecutionStatus.RUNNING
                found.append((running, execution.id, execution.run_id))

        await self._rpc(collect(), "list")
        if not found:
            return None
        _, workflow_id, run_id = max(found, key=lambda f: f[0])
        handle = self.client.get_workflow_handle(workflow_id, run_id=run_id)
        return await self._rpc(handle.describe(rpc_timeout=RPC_TIMEOUT), f"describe {workflow_id}")

    async def _run(self, target: Target) -> InvocationPolicy:
        described = None
        if target.name:
            described = await self._described(
                run_workflow_id(Namespace(target.namespace), target.name),
                search_typed.KRT_RUN_UID,
                target.uid,
            )
        if described is None:
            query = (
                f"WorkflowType='RunWorkflow' AND {search.RUN_UID}='{target.uid}' "
                f"AND {search.NAMESPACE}='{target.namespace}'"
            )
            described = await self._listed(query)
        if described is None:
            return InvocationPolicy(
                exists=False, found=False, reason=f"no Run of uid {target.uid} in {target.namespace}"
            )
        run = await self._run_manifest(described)
        phase = _first(described, search_typed.KRT_PHASE)
        function = run.spec.mode.function
        block = function.async_invocations if function is not None else AsyncInvocations()
        creator = run.metadata.creator
        if function is None:
            return _policy(
                block, exists=False, ready=False, creator=creator, reason="a task Run takes no invocations"
            )
        if described.status != WorkflowExecutionStatus.RUNNING or phase in _ENDED or phase == search.DELETED:
            return _policy(
                block, exists=False, ready=False, creator=creator, reason=f"the Run ended {phase or 'closed'}"
            )
        ready = phase == RunPhase.Ready.value
        return _policy(
            block, exists=True, ready=ready, creator=creator, reason="" if ready else f"the Run is {phase}"
        )

    async def _run_manifest(self, described: WorkflowExecutionDescription) -> Run:
        key = (described.id, described.run_id or "")
        cached = self._runs.get(key)
        if cached is not None:
            self._runs.move_to_end(key)
            return cached
        handle = self.client.get_workflow_handle(described.id, run_id=described.run_id)

        async def first() -> Any:
            async for event in handle.fetch_history_events(page_size=1, rpc_timeout=RPC_TIMEOUT):
                return event
            return None

        event = await self._rpc(first(), f"history of {described.id}")
        if event is None or not event.HasField("workflow_execution_started_event_attributes"):
            raise ApplicationError(f"{described.id} has no start", type="TargetUnreadable")
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        try:
            [started] = await self.client.data_converter.decode(payloads, [RunInput])
        except Exception as err:  # not a Run's input: never this worker's to read
            raise ApplicationError(
                f"{described.id} holds no Run ({type(err).__name__})",
                type="TargetUnreadable",
                non_retryable=True,
            ) from None
        run: Run = started.run
        self._runs[key] = run
        while len(self._runs) > MAX_CACHED_RUNS:
            self._runs.popitem(last=False)
        return run

    async def _function(self, target: Target) -> InvocationPolicy:
        described = None
        if target.name:
            described = await self._described(
                function_workflow_id(Namespace(target.namespace), target.name),
                search_typed.KRT_FUNCTION,
                target.uid,
            )
        if described is None:
            query = (
                f"WorkflowType='FunctionWorkflow' AND {search.FUNCTION}='{target.uid}' "
                f"AND {search.NAMESPACE}='{target.namespace}'"
            )
            described = await self._listed(query)
        phase = _first(described, search_typed.KRT_PHASE) if described is not None else ""
        gone = (FunctionPhase.Deleting.value, FunctionPhase.Deleted.value, search.DELETED)
        if described is None or described.status != WorkflowExecutionStatus.RUNNING or phase in gone:
            if described is None:
                return InvocationPolicy(exists=False, found=False, reason="no such Function")
            why = f"the Function is {phase}" if phase in gone else "the Function's workflow is closed"
            return InvocationPolicy(exists=False, reason=why)
        handle = self.client.get_workflow_handle(described.id, run_id=described.run_id)
        fn: Function = await self._rpc(
            handle.query(QUERY_FUNCTION, result_type=Function, rpc_timeout=RPC_TIMEOUT),
            f"query {described.id}",
        )
        function = fn.spec.mode.function
        block = function.async_invocations if function is not None else AsyncInvocations()
        return _policy(block, exists=True, ready=True, creator=fn.metadata.creator, reason="")


class InvocationAttempts:
    """`attempt_invocation`, through the gateways at `gateways` (their heartbeat servers)."""

    def __init__(
        self,
        gateways: Sequence[str],
        *,
        answer_margin_s: float = ANSWER_MARGIN_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self.gateways = list(gateways)
        self.answer_margin_s = answer_margin_s
        self.connect_timeout_s = connect_timeout_s
        # One channel per gateway for every attempt: a TLS handshake per attempt cost the gateway
        # and the worker more than the attempt itself. One that cannot connect is dropped, so the
        # next attempt connects anew instead of waiting out gRPC's reconnect backoff.
        self._channels: dict[str, grpc.aio.Channel] = {}

    @activity.defn(name=ACTIVITY_ATTEMPT)
    async def attempt_invocation(self, request: AttemptRequest) -> AttemptOutcome:
        if not self.gateways:
            return AttemptOutcome(httpStatus=0, reason=NO_GATEWAY, dispatched=False)
        first = (request.attempt - 1) % len(self.gateways)
        order = self.gateways[first:] + self.gateways[:first]
        timeout = request.timeoutSeconds or float(DEFAULT_INVOKE_TIMEOUT_SECONDS)
        message = gd.AttemptInvocationRequest(
            namespace=request.target.namespace,
            target_kind=request.target.kind.value,
            target_uid=request.target.uid,
            runtime=request.target.runtime,
            invocation_id=request.invocationId,
            body=request.body.encode(),
            # at least 1 ms: 0 is the gateway's default timeout, never a sub-millisecond one
            timeout_ms=max(1, round(request.timeoutSeconds * 1000)) if request.timeoutSeconds else 0,
            attempt=request.attempt,
            share_percent=request.share,
        )
        # One budget for every gateway tried: the workflow's own timeout of the activity is longer.
        ends = time.monotonic() + timeout + self.answer_margin_s
        beats = _Beats(marking=request.marksDispatch)
        beating = asyncio.create_task(beats.run())
        try:
            for address in order:
                left = ends - time.monotonic()
                if left <= 0:
                    break
                outcome = await self._attempt_at(address, message, beats, deadline_s=left)
                if outcome is not None:
                    return outcome
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating
        return AttemptOutcome(httpStatus=0, reason=GATEWAY_UNREACHABLE, dispatched=False)

    async def _forget(self, address: str, channel: grpc.aio.Channel) -> None:
        if self._channels.get(address) is channel:
            del self._channels[address]
            await _close_quietly(channel)

    async def close(self) -> None:
        """Close every channel (the worker's stop)."""
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await _close_quietly(channel)

    async def _attempt_at(
        self, address: str, message: gd.AttemptInvocationRequest, beats: _Beats, *, deadline_s: float
    ) -> AttemptOutcome | None:
        """The gateway's answer; None when the call did not reach it (the next one is tried)."""
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = gateway_channel(address)
        if not await _connected(channel, min(self.connect_timeout_s, deadline_s)):
            log.info("gateway %s not reached for an attempt", address)
            await self._forget(address, channel)
            return None
        if not await beats.sent():
            return AttemptOutcome(httpStatus=0, reason=SENT_NOT_RECORDED, dispatched=False)
        stub = gd_grpc.GatewayDispatchStub(channel)
        try:
            answer = await stub.AttemptInvocation(message, timeout=deadline_s)
        except grpc.aio.AioRpcError as err:
            if err.code() in NOT_READ:
                log.warning("gateway %s refused an attempt: %s", address, err.code().name)
                return None
            # sent, and then the deadline or the connection was lost: it may have run
            log.warning("gateway %s lost an attempt: %s", address, err.code().name)
            return AttemptOutcome(httpStatus=0, reason=GATEWAY_LOST, dispatched=True)
        body = answer.body.decode("utf-8", errors="replace")
        if len(body) > MAX_RESULT_BYTES:  # a gateway bounds its answers: past that, not one to keep
            body = ""
        return AttemptOutcome(
            httpStatus=answer.http_status,
            reason=answer.reason[:MAX_REASON_CHARS],
            body=body,
            dispatched=answer.dispatched,
        )


async def _close_quietly(channel: grpc.aio.Channel) -> None:
    with contextlib.suppress(Exception):
        await channel.close()


async def _connected(channel: grpc.aio.Channel, timeout_s: float) -> bool:
    """Whether the channel connected (TCP and the TLS handshake, the gateway verified) within
    `timeout_s`; a refused connection or a failed handshake is False at once, not retried."""
    try:
        async with asyncio.timeout(timeout_s):
            state = channel.get_state(try_to_connect=True)
            while state is not grpc.ChannelConnectivity.READY:
                if state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN):
                    return False
                await channel.wait_for_state_change(state)
                state = channel.get_state(try_to_connect=True)
    except TimeoutError:
        return False
    return True


class _Beats:
    """The attempt's heartbeats, every HEARTBEAT_EVERY_S while it runs: the workflow's heartbeat
    timeout sees a worker lost.

    Marking, each beat is a RecordActivityTaskHeartbeat of the activity's own, awaited and one at
    a time (the SDK's beats are neither awaited nor ordered with another call): once `sent()`
    returned True the server holds ATTEMPT_SENT, and no beat without it can land after."""

    def __init__(self, *, marking: bool) -> None:
        self._details: tuple[str, ...] = ()
        self._turn = asyncio.Lock()
        # A beat without the mark that failed may still land on the server, after the mark too.
        self._unsure = False
        self._handle = (
            activity.client().get_async_activity_handle(task_token=activity.info().task_token)
            if marking
            else None
        )

    async def run(self) -> None:
        if self._handle is not None:  # marking: the mark is the first beat of most attempts
            await asyncio.sleep(HEARTBEAT_EVERY_S)
        while True:
            await self._beat()
            await asyncio.sleep(HEARTBEAT_EVERY_S)

    async def _beat(self) -> None:
        if self._handle is None:
            activity.heartbeat()
            return
        async with self._turn:
            try:
                await self._handle.heartbeat(*self._details, rpc_timeout=HEARTBEAT_RPC_TIMEOUT)
            except Exception as err:  # the next beat tries again; a timeout is the workflow's to see
                self._unsure = self._unsure or not self._details
                log.info("an attempt's heartbeat failed: %s", type(err).__name__)

    async def sent(self) -> bool:
        """Whether the server recorded ATTEMPT_SENT (at once when not marking): only then may the
        request go out."""
        if self._handle is None or self._details:
            return True
        async with self._turn:
            if self._unsure:
                log.warning("an attempt's heartbeat failed before its dispatch was recorded; not sent")
                return False
            try:
                await self._handle.heartbeat(ATTEMPT_SENT, rpc_timeout=HEARTBEAT_RPC_TIMEOUT)
            except Exception as err:  # timed out already, or not recorded: never sent
                log.warning("an attempt's dispatch was not recorded: %s; not sent", type(err).__name__)
                return False
            self._details = (ATTEMPT_SENT,)
        return True
