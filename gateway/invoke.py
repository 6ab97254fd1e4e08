"""POST /v1/namespaces/{namespace}/runtimes/{runtime}/functions/{uid}:invoke

The hot path: route cache → cached authorization → the body (bounded in size and rate) → one
InvokeFunction on the owning host, with the fence (run uid, attempt, host uid) → the gateway's own
answer rebuilt from the owner's (gateway/answers.py). Nothing here calls Temporal or Kubernetes,
and nothing is retried after dispatch: a failure after the request left may have run the function.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid

import grpc
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from gateway.answers import answer_body
from gateway.auth import Authorizer, Resource, bearer_token
from gateway.errors import (
    BadRequest,
    BodyTimeout,
    Busy,
    ClientAborted,
    Forbidden,
    GatewayError,
    NotFound,
    NotReady,
    PayloadTooLarge,
    UpstreamFailed,
    UpstreamTimeout,
)
from gateway.known import KnownRuns
from gateway.listener import HttpLimits
from gateway.raw import RawError, RawUpstreams
from gateway.routes import Route, RouteCache
from kruntimes.api.limits import DEFAULT_INVOKE_TIMEOUT_SECONDS, MAX_INVOKE_TIMEOUT_SECONDS, MAX_PAYLOAD_BYTES
from kruntimes.api.names import validate_invocation_id
from kruntimes.api.phases import TERMINAL_PHASES
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.wire import headers
from kruntimes.wire.reasons import GatewayReason as R
from kruntimes.wire.reasons import HostReason, reason_of

log = logging.getLogger("gateway.invoke")

# where the middleware finds the invocation id of a request (a typed key: plain strings warn)
INVOCATION_ID = web.RequestKey("invocation_id", str)
RPC_MARGIN_S = 5.0
_TERMINAL = {p.value for p in TERMINAL_PHASES}


class Upstreams:
    """One gRPC channel per host address, kept open (no per-request client or TLS setup), and
    one raw connection per host invoke address (gateway/raw.py) for hosts that advertise one."""

    def __init__(self) -> None:
        self._stubs: dict[str, pb_grpc.FunctionRuntimeAsyncStub] = {}
        self._channels: list[grpc.aio.Channel] = []
        self.raw = RawUpstreams()

    def stub(self, address: str) -> pb_grpc.FunctionRuntimeAsyncStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = grpc.aio.insecure_channel(address)
            self._channels.append(channel)
            stub = self._stubs[address] = pb_grpc.FunctionRuntimeStub(channel)
        return stub

    async def close(self) -> None:
        self.raw.close()
        for channel in self._channels:
            await channel.close()


def invocation_id(request: web.Request) -> str:
    value = request.headers.get(headers.INVOCATION_ID)
    if value is None:
        return str(uuid.uuid4())
    try:
        return validate_invocation_id(value)
    except ValueError as exc:
        raise BadRequest(str(exc), reason=R.INVALID_INVOCATION_ID) from None


def _too_large() -> PayloadTooLarge:
    return PayloadTooLarge(f"the body is larger than {MAX_PAYLOAD_BYTES} bytes")


async def _receive(request: web.Request, limits: HttpLimits) -> bytes:
    """The body as it arrives: at most 1 MiB, at the minimum rate once the grace has passed."""
    content = request.content
    if content.is_eof():  # it came whole with the headers: nothing to wait for
        data = content.read_nowait()
        if len(data) > MAX_PAYLOAD_BYTES:
            raise _too_large()
        return data
    loop = asyncio.get_running_loop()
    started = loop.time()
    body = bytearray()
    while True:
        try:
            async with asyncio.timeout_at(limits.body_deadline(started, len(body))):
                chunk = await content.read(65536)
        except TimeoutError:
            raise BodyTimeout(
                f"the body arrived slower than {limits.body_min_rate} bytes/s "
                f"after {limits.body_timeout_s:g}s",
                reason=R.REQUEST_BODY_TIMEOUT,
            ) from None
        if not chunk:
            return bytes(body)
        body += chunk
        if len(body) > MAX_PAYLOAD_BYTES:
            raise _too_large()


async def read_body(request: web.Request, limits: HttpLimits) -> bytes:
    """At most 1 MiB, refused before it is read whole (Content-Length or while streaming), arriving
    at the minimum rate of `limits` (408 RequestBodyTimeout); a caller that closes the connection
    meanwhile is ClientAborted, and broken body framing is 400 MalformedRequest."""
    if request.content_length is not None and request.content_length > MAX_PAYLOAD_BYTES:
        raise _too_large()
    try:
        data = await _receive(request, limits)
    except (ConnectionError, RequestPayloadError) as exc:
        if request.transport is None:
            raise ClientAborted() from None
        if isinstance(exc, RequestPayloadError):
            raise BadRequest("the body's framing is broken", reason=R.MALFORMED_REQUEST) from None
        raise
    if data:
        try:
            json.loads(data)
        except (ValueError, RecursionError):
            raise BadRequest("the body is not a JSON document", reason=R.MALFORMED_JSON) from None
    return data


def _timeout_s(request: web.Request) -> float:
    raw = request.headers.get(headers.TIMEOUT)
    if raw is None:
        return float(DEFAULT_INVOKE_TIMEOUT_SECONDS)
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"{headers.TIMEOUT} must be a number of seconds", reason=R.INVALID_TIMEOUT) from None
    if not 0 < value <= MAX_INVOKE_TIMEOUT_SECONDS:
        raise BadRequest(
            f"{headers.TIMEOUT} must be in (0, {MAX_INVOKE_TIMEOUT_SECONDS}]", reason=R.INVALID_TIMEOUT
        )
    return value


class InvokeHandler:
    def __init__(
        self,
        *,
        routes: RouteCache,
        known: KnownRuns,
        authorizer: Authorizer,
        upstreams: Upstreams,
        limits: HttpLimits | None = None,
    ) -> None:
        self.routes = routes
        self.known = known
        self.authorizer = authorizer
        self.upstreams = upstreams
        self.limits = limits or HttpLimits()

    async def __call__(self, request: web.Request) -> web.Response:
        inv = invocation_id(request)
        request[INVOCATION_ID] = inv
        namespace = request.match_info["namespace"]
        runtime = request.match_info["runtime"]
        run_uid = request.match_info["uid"]
        token = bearer_token(request.headers.get(headers.AUTHORIZATION))
        route = self.routes.route(run_uid)
        if route is None or route.namespace != namespace or route.runtime != runtime:
            await self._miss(token, namespace, runtime, run_uid)
        assert route is not None
        await self.authorizer.authorize(
            token, Resource(namespace=namespace, name=route.name, run_uid=run_uid)
        )
        if not route.ready:
            raise NotReady("the Run is registered but not ready", reason=R.RUN_NOT_READY)
        timeout_s = _timeout_s(request)
        payload = await read_body(request, self.limits)
        answer = await self._dispatch(route, inv, payload, timeout_s)
        return self._answer(answer, inv)

    async def _miss(self, token: str, namespace: str, runtime: str, run_uid: str) -> None:
        """No route: 503 for a Run that exists and will (or did) have one, else 404."""
        known = self.known.get(run_uid)
        if (
            known is None
            or known.namespace != namespace
            or known.runtime != runtime
            or known.phase in _TERMINAL
        ):
            # Authenticate first: a caller without a valid token learns nothing about which uids
            # exist (401 either way). A valid token that may not see this namespace gets the 404.
            with contextlib.suppress(Forbidden):
                await self.authorizer.authorize(
                    token, Resource(namespace=namespace, name="", run_uid=run_uid)
                )
            raise NotFound("no such function in this namespace and runtime")
        await self.authorizer.authorize(
            token, Resource(namespace=namespace, name=known.name, run_uid=run_uid)
        )
        raise NotReady(f"the Run is {known.phase or 'starting'}", reason=R.RUN_NOT_READY, retry_after=2)

    async def _dispatch(
        self, route: Route, inv: str, payload: bytes, timeout_s: float
    ) -> pb.InvokeFunctionResponse:
        request = pb.InvokeFunctionRequest(
            registration_id=route.registration_id,
            invocation_id=inv,
            payload=payload,
            timeout_ms=max(1, round(timeout_s * 1000)),
            fence=pb.Fence(run_uid=route.run_uid, attempt=route.attempt, host_uid=route.host_uid),
        )
        if route.invoke_address:
            try:
                return await self.upstreams.raw.client(route.invoke_address).invoke(
                    request, timeout=timeout_s + RPC_MARGIN_S
                )
            except RawError as raw:
                raise self._error(raw.code, raw.reason, raw.message, route) from None
        try:  # a host without an invoke port
            return await self.upstreams.stub(route.address).InvokeFunction(
                request, timeout=timeout_s + RPC_MARGIN_S
            )
        except grpc.aio.AioRpcError as err:
            raise self._error(
                err.code(), reason_of(err.trailing_metadata()), err.details() or "", route
            ) from None

    def _error(self, code: grpc.StatusCode, reason: str, details: str, route: Route) -> GatewayError:
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return Busy("the function is running another invocation; retry later")
        if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
            self.routes.drop(route.run_uid, route.host_uid)  # stale: the host holds another generation
            return NotReady("the Run's registration moved; retry shortly", reason=R.ROUTE_STALE)
        if code == grpc.StatusCode.UNAVAILABLE and reason == HostReason.NOT_READY:
            return NotReady("the function cannot serve right now", reason=R.RUN_NOT_READY, retry_after=5)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return UpstreamTimeout(
                "the owner did not answer in time; the function may have run", reason=R.OWNER_TIMEOUT
            )
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return BadRequest(details or "invalid request", reason=R.INVALID_REQUEST)
        return UpstreamFailed(
            "the owner failed after dispatch; the function may have run", reason=R.OWNER_UNREACHABLE
        )

    def _answer(self, answer: pb.InvokeFunctionResponse, inv: str) -> web.Response:
        """The gateway's own answer, rebuilt from the owner's (gateway/answers.py)."""
        return web.Response(
            body=answer_body(answer, inv),
            content_type="application/json",
            headers={headers.INVOCATION_ID: inv},
        )


__all__ = ["INVOCATION_ID", "InvokeHandler", "Upstreams"]
