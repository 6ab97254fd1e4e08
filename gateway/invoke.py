"""POST /v1/namespaces/{namespace}/runtimes/{runtime}/functions/{uid}:invoke

The hot path: route cache → cached authorization → the body (bounded in size and rate) → one
InvokeFunction on the owning host, with the fence (run uid, attempt, host uid) → the gateway's own
answer rebuilt from the owner's (gateway/answers.py). Nothing here calls Temporal or Kubernetes,
and nothing is retried after dispatch: a failure after the request left may have run the function.

"Not sent" and "sent, then failed" are told apart: a request that never reached the owner (its
route went away while the body was read, the connection was refused, TLS failed, the host was not
the one the route names or did not accept the connection) is answered 503 OwnerUnavailable with
Retry-After — the function did not run; a failure after dispatch is 502 or 504 and never retried.
Hops to hosts are mutual TLS with the gateway's platform certificate, and the host must present
exactly the identity of the route (kruntimes.pki).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import uuid

import grpc
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from kruntimes.api.limits import DEFAULT_INVOKE_TIMEOUT_SECONDS, MAX_INVOKE_TIMEOUT_SECONDS, MAX_PAYLOAD_BYTES
from kruntimes.api.names import is_run_uid, validate_dns1123_label, validate_invocation_id
from kruntimes.api.phases import TERMINAL_PHASES
from kruntimes.gateway.answers import answer_body
from kruntimes.gateway.auth import Authorizer, Resource, bearer_token
from kruntimes.gateway.errors import (
    BadRequest,
    Busy,
    ClientAborted,
    Forbidden,
    GatewayError,
    NotFound,
    OwnerUnavailable,
    PayloadTooLarge,
    RunNotReady,
    UpstreamFailed,
    UpstreamTimeout,
)
from kruntimes.gateway.listener import GatewayProtocol, HttpLimits, receive_body, send_continue
from kruntimes.gateway.raw import CallerGone, RawError, RawUpstreams
from kruntimes.gateway.routes import Route, RouteCache
from kruntimes.pki import Identity, PeerTLS
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.temporal.known_runs import KnownRuns
from kruntimes.wire import headers
from kruntimes.wire.reasons import GatewayReason as R
from kruntimes.wire.reasons import HostReason, reason_of

log = logging.getLogger("kruntimes.gateway.invoke")

# where the middleware finds the invocation id of a request (a typed key: plain strings warn)
INVOCATION_ID = web.RequestKey("invocation_id", str)
RPC_MARGIN_S = 5.0
RETIRED_GRACE_S = MAX_INVOKE_TIMEOUT_SECONDS + RPC_MARGIN_S  # the longest call a channel may carry
CONNECT_TIMEOUT_S = 5.0
# gRPC channels to hosts without an invoke port: reconnect soon after a failure
_CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 2000)]
_NOT_DELIVERED = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})
_TERMINAL = {p.value for p in TERMINAL_PHASES}
# A route miss for a Run uid the gateway never heard of waits this long for the route (a Run
# Ready a moment before its host's beat arrives), polled; at most this many such waits at once.
ROUTE_GRACE_S = 1.5
ROUTE_POLL_S = 0.05
MAX_ROUTE_WAITERS = 256


class NotConnected(Exception):
    """A gRPC channel to a host did not become ready: nothing was sent on it."""


class Upstreams:
    """One raw connection per host (gateway/raw.py) for hosts that advertise an invoke port, and one
    gRPC channel per host identity for the others, kept open (no per-request client or TLS setup).
    A channel is retired — closed once the calls on it have ended, at most RETIRED_GRACE_S later —
    when its host names another address (so a host cannot make the gateway hold a channel for each
    address it ever named) or when the certificate files changed (no call on it is cut)."""

    def __init__(self, *, tls: PeerTLS, invoke_tls: bool = True) -> None:
        """`invoke_tls` False: the raw invoke hop in plaintext, only the invoke bench's baseline."""
        self.tls = tls
        self._channels: dict[Identity, tuple[int, str, grpc.aio.Channel]] = {}
        self._retired: set[grpc.aio.Channel] = set()
        self._closing: set[asyncio.Task[None]] = set()
        self.raw = RawUpstreams(tls=tls if invoke_tls else None)

    def channel(self, address: str, host: Identity) -> grpc.aio.Channel:
        self.tls.refresh()
        held = self._channels.get(host)
        if held is not None and held[0] == self.tls.generation and held[1] == address:
            return held[2]
        if held is not None:
            self._retire(held[2])
        generation = self.tls.generation
        channel = grpc.aio.secure_channel(
            address,
            self.tls.channel_credentials(),
            options=[*self.tls.channel_options(host), *_CHANNEL_OPTIONS],
        )
        self._channels[host] = (generation, address, channel)
        return channel

    def _retire(self, channel: grpc.aio.Channel) -> None:
        self._retired.add(channel)
        task = asyncio.get_running_loop().create_task(channel.close(grace=RETIRED_GRACE_S))
        self._closing.add(task)

        def closed(done: asyncio.Task[None]) -> None:
            self._closing.discard(done)
            self._retired.discard(channel)

        task.add_done_callback(closed)

    async def invoke_grpc(
        self,
        address: str,
        host: Identity,
        request: pb.InvokeFunctionRequest,
        *,
        timeout: float,
        lost: asyncio.Future[None] | None = None,
    ) -> pb.InvokeFunctionResponse:
        """InvokeFunction on `host` at `address` over gRPC; NotConnected (nothing sent) when the
        channel does not connect (or was retired meanwhile), grpc.aio.AioRpcError for a failure
        after it was sent. `lost` done (the caller hung up) before the answer: the call is
        cancelled, which the host takes as the invoke port's cancel (the invocation withdrawn if it
        still waits its turn, else left to run to its end), and CallerGone."""
        channel = self.channel(address, host)
        await connected(channel)
        try:
            call = pb_grpc.FunctionRuntimeStub(channel).InvokeFunction(request, timeout=timeout)
            if lost is None:
                response: pb.InvokeFunctionResponse = await call
            else:
                response = await _unless_lost(call, lost)
        except grpc.aio.UsageError as exc:  # retired while it connected: nothing was sent
            raise NotConnected(str(exc)) from None
        return response

    async def close(self) -> None:
        self.raw.close()
        channels = [held[2] for held in self._channels.values()] + list(self._retired)
        self._channels, self._retired = {}, set()
        for channel in channels:
            await channel.close()
        for task in list(self._closing):
            task.cancel()


async def _unless_lost(
    call: grpc.aio.UnaryUnaryCall[pb.InvokeFunctionRequest, pb.InvokeFunctionResponse],
    lost: asyncio.Future[None],
) -> pb.InvokeFunctionResponse:
    """`call`'s answer; CallerGone once `lost` is done before it (the call cancelled then)."""

    def hung_up(_: asyncio.Future[None]) -> None:
        call.cancel()

    if lost.done():
        call.cancel()
    lost.add_done_callback(hung_up)
    try:
        return await call
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if lost.done() and (current is None or not current.cancelling()):  # not the gateway's own
            raise CallerGone() from None
        raise
    finally:
        lost.remove_done_callback(hung_up)


async def connected(channel: grpc.aio.Channel, *, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Until `channel` is READY; NotConnected when it fails to connect (refused, TLS failed) or
    does not within `timeout_s`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    state = channel.get_state(try_to_connect=True)
    while state is not grpc.ChannelConnectivity.READY:
        if state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN):
            raise NotConnected(f"the channel is {state.name}")
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            raise NotConnected(f"not connected within {timeout_s:g}s")
        try:
            await asyncio.wait_for(channel.wait_for_state_change(state), remaining)
        except TimeoutError:
            raise NotConnected(f"not connected within {timeout_s:g}s") from None
        state = channel.get_state(try_to_connect=True)


def invocation_id(request: web.Request) -> str:
    value = request.headers.get(headers.INVOCATION_ID)
    if value is None:
        return str(uuid.uuid4())
    try:
        return validate_invocation_id(value)
    except ValueError as exc:
        raise BadRequest(str(exc), reason=R.INVALID_INVOCATION_ID) from None


def logged_target(request: web.Request) -> dict[str, str]:
    """The invoke path's runtime and run uid (a Function's URL: its function uid; the middleware
    adds the replica's run uid) as the access log shows them: each only when it is what it should
    be (a DNS-1123 label, a canonical UUID), else "" — the path is the caller's, and a token, a
    path or kilobytes of anything put there never reach a log."""
    if "runtime" not in request.match_info:  # a Function's URL
        function_uid = request.match_info.get("uid", "")
        return {"function_uid": function_uid if is_run_uid(function_uid) else ""}
    runtime = request.match_info.get("runtime", "")
    try:
        validate_dns1123_label(runtime, field="runtime")
    except ValueError:
        runtime = ""
    run_uid = request.match_info.get("uid", "")
    return {"runtime": runtime, "run_uid": run_uid if is_run_uid(run_uid) else ""}


def _too_large() -> PayloadTooLarge:
    return PayloadTooLarge(f"the body is larger than {MAX_PAYLOAD_BYTES} bytes")


async def read_body(request: web.Request, limits: HttpLimits) -> bytes:
    """At most 1 MiB, refused before it is read whole (Content-Length or while streaming), arriving
    at the minimum rate of `limits` (408 RequestBodyTimeout); a caller that closes the connection
    meanwhile is ClientAborted, and broken body framing is 400 MalformedRequest."""
    if request.content_length is not None and request.content_length > MAX_PAYLOAD_BYTES:
        raise _too_large()
    await send_continue(request)
    try:
        data = await receive_body(request, limits, max_bytes=MAX_PAYLOAD_BYTES)
    except (ConnectionError, RequestPayloadError) as exc:
        if request.transport is None:
            raise ClientAborted() from None
        if isinstance(exc, RequestPayloadError):
            raise BadRequest("the body's framing is broken", reason=R.MALFORMED_REQUEST) from None
        raise
    return check_json(data)


def check_json(data: bytes) -> bytes:
    """`data` if it is empty or one JSON document, else 400 MalformedJSON."""
    if data:
        try:
            json.loads(data)
        except (ValueError, RecursionError):
            raise BadRequest("the body is not a JSON document", reason=R.MALFORMED_JSON) from None
    return data


# a decimal number of ASCII digits, as the SDK writes one (`f"{timeout:g}"`, so an exponent too)
_SECONDS = re.compile(r"([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)


def requested_timeout_s(request: web.Request) -> float:
    raw = request.headers.get(headers.TIMEOUT)
    if raw is None:
        return float(DEFAULT_INVOKE_TIMEOUT_SECONDS)
    if _SECONDS.fullmatch(raw) is None:
        # float() also takes "1_0", Arabic-Indic and fullwidth digits, "nan", "infinity"
        raise BadRequest(f"{headers.TIMEOUT} must be a number of seconds", reason=R.INVALID_TIMEOUT)
    value = float(raw)
    if not 0 < value <= MAX_INVOKE_TIMEOUT_SECONDS:
        raise BadRequest(
            f"{headers.TIMEOUT} must be in (0, {MAX_INVOKE_TIMEOUT_SECONDS}]", reason=R.INVALID_TIMEOUT
        )
    return value


def _busy(reason: str) -> Busy:
    """The host refused the invocation for load (it did not run): which load, in the caller's words."""
    if reason == HostReason.QUEUE_TIMEOUT:
        return Busy(
            "the invocation waited its turn too long and did not run; retry later", reason=R.QUEUE_TIMEOUT
        )
    if reason == HostReason.HOST_BUSY:
        return Busy(
            "the function's host runs as many invocations as it may; it did not run, retry later",
            reason=R.HOST_BUSY,
        )
    return Busy("the function runs as many invocations as it takes and its queue is full; retry later")


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
        self._route_waiters = 0  # route misses waiting out ROUTE_GRACE_S now

    async def __call__(self, request: web.Request) -> web.Response:
        inv = invocation_id(request)
        request[INVOCATION_ID] = inv
        namespace = request.match_info["namespace"]
        runtime = request.match_info["runtime"]
        run_uid = request.match_info["uid"]
        token = bearer_token(request.headers.get(headers.AUTHORIZATION))
        route = await self.find_route(namespace, runtime, run_uid)
        if route is None:
            await self._miss(token, namespace, runtime, run_uid)
        assert route is not None
        await self.authorizer.authorize(
            token, Resource(namespace=namespace, name=route.name, run_uid=run_uid)
        )
        if not route.ready:
            raise RunNotReady("the Run is registered but not ready", reason=R.RUN_NOT_READY)
        timeout_s = requested_timeout_s(request)
        payload = await read_body(request, self.limits)
        body = await self.deliver(route, inv, payload, timeout_s, lost=caller_lost(request))
        return self._answer(body, inv)

    async def find_route(self, namespace: str, runtime: str, run_uid: str) -> Route | None:
        """The Run's route in `namespace` and `runtime` (None: `missing` says why), after the
        grace a Run uid never heard of gets."""
        route = self.routes.route(run_uid)  # routes hold only validated uids
        if route is None and is_run_uid(run_uid) and self.known.get(run_uid) is None:
            route = await self._route_soon(run_uid)
        if route is None or route.namespace != namespace or route.runtime != runtime:
            return None
        return route

    async def deliver(
        self,
        route: Route,
        inv: str,
        payload: bytes,
        timeout_s: float,
        *,
        lost: asyncio.Future[None] | None = None,
    ) -> bytes:
        """One invocation of the Run of `route` (found before the body was read), as the sync
        invoke and an async attempt (gateway/dispatch.py) both run it: the 200 body, or the
        GatewayError it is answered with."""
        current = self.routes.route(route.run_uid)  # the body took time: is the route still there?
        if current is not route:
            if current is None or current.namespace != route.namespace or current.runtime != route.runtime:
                raise OwnerUnavailable("the Run's owner went away before the request was sent")
            if not current.ready:
                raise RunNotReady("the Run is registered but not ready", reason=R.RUN_NOT_READY)
            route = current
        answer = await self._dispatch(route, inv, payload, timeout_s, lost=lost)
        return answer_body(answer, inv)

    async def _route_soon(self, run_uid: str) -> Route | None:
        """A Run this gateway never heard of may be one just made Ready whose host's beat is on
        its way (the worker learns of the registration by the same host's answer): its route,
        if it arrives within ROUTE_GRACE_S, else None. At most MAX_ROUTE_WAITERS wait at once;
        past them a miss is answered at once, so junk uids cannot hold the gateway's sockets."""
        if self._route_waiters >= MAX_ROUTE_WAITERS:
            return None
        self._route_waiters += 1
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + ROUTE_GRACE_S
            while loop.time() < deadline:
                await asyncio.sleep(ROUTE_POLL_S)
                route = self.routes.route(run_uid)
                if route is not None:
                    return route
            return None
        finally:
            self._route_waiters -= 1

    async def _miss(self, token: str, namespace: str, runtime: str, run_uid: str) -> None:
        """No route: 503 for a Run that exists and will (or did) have one, else 404."""
        error, name = self.missing(namespace, runtime, run_uid)
        resource = Resource(namespace=namespace, name=name, run_uid=run_uid if is_run_uid(run_uid) else "")
        if isinstance(error, NotFound):
            # Authenticate first: a caller without a valid token learns nothing about which uids
            # exist (401 either way). A valid token that may not see this namespace gets the 404.
            with contextlib.suppress(Forbidden):
                await self.authorizer.authorize(token, resource)
        else:
            await self.authorizer.authorize(token, resource)
        raise error

    def missing(self, namespace: str, runtime: str, run_uid: str) -> tuple[GatewayError, str]:
        """Why a Run has no route here, and its name if known: 503 for a Run that exists and will
        (or did) have one, else 404."""
        if not is_run_uid(run_uid):  # not a Run uid: nothing to look up, never a path or a key
            return NotFound("no such function in this namespace and runtime"), ""
        if not self.known.refreshed and self.known.client is not None:
            # Just started: no heartbeat and no list of Runs yet, so nothing is known to be absent.
            return RunNotReady("the gateway is starting", reason=R.RUN_NOT_READY, retry_after=1), ""
        known = self.known.get(run_uid)
        if (
            known is None
            or known.namespace != namespace
            or known.runtime != runtime
            or known.phase in _TERMINAL
        ):
            return NotFound("no such function in this namespace and runtime"), ""
        phase = known.phase or "starting"
        return RunNotReady(f"the Run is {phase}", reason=R.RUN_NOT_READY, retry_after=2), known.name

    async def _dispatch(
        self,
        route: Route,
        inv: str,
        payload: bytes,
        timeout_s: float,
        *,
        lost: asyncio.Future[None] | None = None,
    ) -> pb.InvokeFunctionResponse:
        """The host's answer. `lost` (the caller's connection, `caller_lost`) done before it: the
        host is told to withdraw the invocation if it still waits its turn, and ClientAborted."""
        request = pb.InvokeFunctionRequest(
            registration_id=route.registration_id,
            invocation_id=inv,
            payload=payload,
            timeout_ms=max(1, round(timeout_s * 1000)),
            fence=pb.Fence(run_uid=route.run_uid, attempt=route.attempt, host_uid=route.host_uid),
        )
        if route.invoke_address:
            client = self.upstreams.raw.client(
                route.invoke_address, runtime=route.runtime, host_id=route.host_id
            )
            try:
                return await client.invoke(request, timeout=timeout_s + RPC_MARGIN_S, lost=lost)
            except CallerGone:
                raise ClientAborted() from None
            except RawError as raw:
                if not raw.sent:
                    log.warning(
                        "invoke not delivered", extra={"run_uid": route.run_uid, "error": raw.message}
                    )
                    raise OwnerUnavailable("the Run's owner could not be reached; it did not run") from None
                raise self._error(raw.code, raw.reason, raw.message, route) from None
        try:  # a host without an invoke port
            return await self.upstreams.invoke_grpc(
                route.address, route.host, request, timeout=timeout_s + RPC_MARGIN_S, lost=lost
            )
        except CallerGone:
            raise ClientAborted() from None
        except NotConnected as exc:
            log.warning("invoke not delivered", extra={"run_uid": route.run_uid, "error": str(exc)})
            raise OwnerUnavailable("the Run's owner could not be reached; it did not run") from None
        except grpc.aio.AioRpcError as err:
            raise self._error(
                err.code(), reason_of(err.trailing_metadata()), err.details() or "", route
            ) from None

    def _error(self, code: grpc.StatusCode, reason: str, details: str, route: Route) -> GatewayError:
        if code in _NOT_DELIVERED:  # the host refused the gateway itself: nothing ran
            log.error("the owner refused the gateway", extra={"run_uid": route.run_uid, "reason": reason})
            return OwnerUnavailable("the Run's owner refused the gateway; it did not run")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return _busy(reason)
        if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
            self.routes.drop(route.run_uid, route.host_uid)  # stale: the host holds another generation
            return RunNotReady("the Run's registration moved; retry shortly", reason=R.ROUTE_STALE)
        if code == grpc.StatusCode.UNAVAILABLE and reason == HostReason.NOT_READY:
            return RunNotReady("the function cannot serve right now", reason=R.RUN_NOT_READY, retry_after=5)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return UpstreamTimeout(
                "the owner did not answer in time; the function may have run", reason=R.OWNER_TIMEOUT
            )
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return BadRequest(details or "invalid request", reason=R.INVALID_REQUEST)
        return UpstreamFailed(
            "the owner failed after dispatch; the function may have run", reason=R.OWNER_UNREACHABLE
        )

    def _answer(self, body: bytes, inv: str) -> web.Response:
        """The gateway's own answer (`deliver`'s body, rebuilt from the owner's: gateway/answers.py)."""
        return web.Response(
            body=body,
            content_type="application/json",
            headers={headers.INVOCATION_ID: inv},
        )


def caller_lost(request: web.Request) -> asyncio.Future[None]:
    """Done once the caller hung up (the gateway's listener tells; another never does)."""
    if isinstance(request.protocol, GatewayProtocol):
        return request.protocol.lost()
    return asyncio.get_running_loop().create_future()


__all__ = ["INVOCATION_ID", "InvokeHandler", "Upstreams", "caller_lost", "check_json"]
