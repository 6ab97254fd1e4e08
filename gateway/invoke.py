"""POST /v1/namespaces/{namespace}/runtimes/{runtime}/functions/{uid}:invoke

The hot path: route cache → cached authorization → one InvokeFunction on the owning host, with
the fence (run uid, attempt, host uid). Nothing here calls Temporal or Kubernetes, and nothing is
retried after dispatch: a failure after the request left may have run the function.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid

import grpc
from aiohttp import web

from gateway.auth import Authorizer, Resource, bearer_token
from gateway.errors import (
    BadRequest,
    Busy,
    Forbidden,
    GatewayError,
    NotFound,
    NotReady,
    PayloadTooLarge,
    UpstreamFailed,
    UpstreamTimeout,
)
from gateway.known import KnownRuns
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

# the bodies.InvocationStatus of each outcome answered with 200
SUCCESS_STATUS = {
    pb.INVOCATION_STATUS_SUCCEEDED: b"Succeeded",
    pb.INVOCATION_STATUS_HANDLER_ERROR: b"HandlerError",
    pb.INVOCATION_STATUS_INVALID_OUTPUT: b"InvalidOutput",
}


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


async def read_body(request: web.Request) -> bytes:
    """At most 1 MiB, refused before it is read whole (Content-Length or while streaming)."""
    if request.content_length is not None and request.content_length > MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge(f"the body is larger than {MAX_PAYLOAD_BYTES} bytes")
    body = bytearray()
    while True:
        chunk = await request.content.read(65536)
        if not chunk:
            break
        body += chunk
        if len(body) > MAX_PAYLOAD_BYTES:
            raise PayloadTooLarge(f"the body is larger than {MAX_PAYLOAD_BYTES} bytes")
    data = bytes(body)
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


_NOTHING_CAPTURED = b'{"data":"","truncated":false,"totalBytes":0}'


def _captured(out: pb.CapturedOutput) -> bytes:
    if not out.total_bytes:
        return _NOTHING_CAPTURED  # the common case costs no encoding
    return json.dumps(
        {
            "data": out.data.decode("utf-8", "replace"),
            "truncated": out.truncated,
            "totalBytes": out.total_bytes,
        },
        separators=(",", ":"),
    ).encode()


def success_body(answer: pb.InvokeFunctionResponse, status: bytes) -> bytes:
    """The 200 answer's JSON (bodies.InvokeAnswer), spliced from bytes: the host's (already
    validated) outputs go in as they are, without decoding them."""
    parts = [
        b'{"invocationId":',
        json.dumps(answer.invocation_id).encode(),
        b',"status":"',
        status,
        b'","outputs":',
        answer.outputs_json or b"null",
        b',"stdout":',
        _captured(answer.stdout),
        b',"stderr":',
        _captured(answer.stderr),
        b',"durationMs":',
        str(round(answer.duration_us / 1000, 3)).encode(),
    ]
    if answer.HasField("error"):
        parts += [
            b',"error":',
            json.dumps({"type": answer.error.type, "message": answer.error.message}).encode(),
        ]
    parts.append(b"}")
    return b"".join(parts)


class InvokeHandler:
    def __init__(
        self, *, routes: RouteCache, known: KnownRuns, authorizer: Authorizer, upstreams: Upstreams
    ) -> None:
        self.routes = routes
        self.known = known
        self.authorizer = authorizer
        self.upstreams = upstreams

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
        payload = await read_body(request)
        answer = await self._dispatch(route, inv, payload, timeout_s)
        return self._answer(answer)

    async def _miss(self, token: str, namespace: str, runtime: str, run_uid: str) -> None:
        """No route: 503 for a Run that exists and will (or did) have one, else 404."""
        if not self.known.refreshed and self.known.client is not None:
            # Just started: no heartbeat and no list of Runs yet, so nothing is known to be absent.
            await self.authorizer.authorize(token, Resource(namespace=namespace, name="", run_uid=run_uid))
            raise NotReady("the gateway is starting", reason=R.RUN_NOT_READY, retry_after=1)
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
                if not raw.dispatched:
                    # Nothing reached the host (its process is gone or going): the Run is not
                    # ready there, and it never ran. The route stays until the host's heartbeats
                    # stop counting, or a newer registration of the Run replaces it.
                    raise NotReady(
                        "the Run's host cannot be reached; it is recovering", retry_after=1
                    ) from None
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

    def _answer(self, answer: pb.InvokeFunctionResponse) -> web.Response:
        status = SUCCESS_STATUS.get(answer.status)
        if status is not None:
            return web.Response(
                body=success_body(answer, status),
                content_type="application/json",
                headers={headers.INVOCATION_ID: answer.invocation_id},
            )
        if answer.status == pb.INVOCATION_STATUS_TIMED_OUT:
            raise UpstreamTimeout(
                "the function did not finish within its timeout", reason=R.INVOCATION_TIMEOUT
            )
        raise UpstreamFailed(
            "the function process exited during the invocation", reason=R.FUNCTION_PROCESS_EXITED
        )


__all__ = ["INVOCATION_ID", "InvokeHandler", "Upstreams"]
