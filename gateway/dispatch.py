"""GatewayDispatch.AttemptInvocation: one attempt of an async invocation (issue #44;
docs/async-invocations.md), served on the heartbeat server (gateway/heartbeats.py) to the control
plane's identity only.

An attempt runs exactly as a sync invoke of its target runs, through the same code: a Run's route
(InvokeHandler.find_route, .deliver), a Function's least-loaded Ready replica with the gateway's
bounded wait and its wake from zero (FunctionInvokeHandler.lookup, .deliver_function). It is
answered what the sync caller would have been — the HTTP status, the reason, the body (the 200
answer's JSON, or the ErrorBody) — and `dispatched`: False only when the function provably did not
run (NOT_DISPATCHED: refused or not delivered), True for 200 and for 500, 502 and 504 (it may have
run).

The async share: one target's attempts in this gateway hold at most its asyncInvocations.share (as
its hosts' heartbeats carry it; from a host older than that, the request's `share_percent`, 0: 50) of its
concurrency (a Run's, or its Ready replicas' together), counted from an attempt's start to its end
(its wait at the balancer included), and at least one (a Function without a Ready replica: the one
that wakes it). Past it an attempt is 429 AsyncShareFull and never runs, so sync traffic always
keeps the rest. Each gateway counts its own, as the balancer does.

A worker whose call ends before the answer (it hung up, or its deadline passed) is a sync caller
that hangs up: the attempt leaves the balancer's wait or the host's queue (the invoke port's cancel
frame) and never runs for nobody; one already running runs to its end. It is counted as 499
ClientClosedRequest.

Bounds: the body at most MAX_PAYLOAD_BYTES (413) and JSON (400), the invocation id and the timeout
as a sync invoke's (400; 0 ms: the default timeout), the uid canonical (else 404, as a sync invoke
answers); a namespace, kind, runtime, share or attempt no sync request could carry is
INVALID_ARGUMENT; at most MAX_IN_FLIGHT attempts at once (then 429 AsyncShareFull).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterator
from typing import NamedTuple

import grpc

from kruntimes.api.limits import DEFAULT_INVOKE_TIMEOUT_SECONDS, MAX_INVOKE_TIMEOUT_SECONDS, MAX_PAYLOAD_BYTES
from kruntimes.api.names import is_run_uid, validate_dns1123_label, validate_invocation_id
from kruntimes.gateway.auth import Authorizer, Principal, Resource
from kruntimes.gateway.errors import BadRequest, Forbidden, GatewayError, PayloadTooLarge, RunNotReady
from kruntimes.gateway.function_invoke import Balancer, FunctionInvokeHandler
from kruntimes.gateway.invoke import InvokeHandler, Upstreams, check_json
from kruntimes.gateway.routes import RouteCache
from kruntimes.rpc.v1 import gateway_dispatch_pb2 as gd
from kruntimes.rpc.v1 import gateway_dispatch_pb2_grpc as gd_grpc
from kruntimes.temporal.known_runs import KnownRuns
from kruntimes.wire.reasons import GatewayReason as R

log = logging.getLogger("kruntimes.gateway.dispatch")

RUN, FUNCTION = "Run", "Function"
DEFAULT_SHARE_PERCENT = 50
MAX_IN_FLIGHT = 10_000  # attempts this gateway runs at once, over every target
# the statuses of an answer that proves the function did not run: refused (400, 404, 413, 429) or
# not delivered (503); every other one (200, 500, 502, 504) may have run it
NOT_DISPATCHED = frozenset({400, 404, 408, 413, 429, 503})


class Outcome(NamedTuple):
    status: int
    reason: str
    body: bytes
    dispatched: bool


class _ShareFull(Exception):
    """The target's async attempts hold their share (or the gateway as many as it runs)."""


class _NoCallers:
    """The handlers' authorizer here: an attempt is authorized by its caller's identity (the
    control plane's), never by a token, and the paths it takes call no authorizer."""

    async def authorize(self, token: str, resource: Resource) -> Principal:
        raise Forbidden("async attempts carry no token")

    async def close(self) -> None:
        return None


def error_outcome(error: GatewayError, inv: str) -> Outcome:
    """What a sync caller is answered for `error`, and whether the function may have run."""
    body = _error_body(str(error.reason), error.message, inv)
    return Outcome(error.status, str(error.reason), body, error.status not in NOT_DISPATCHED)


def _error_body(reason: str, message: str, inv: str) -> bytes:
    """An ErrorBody's JSON (gateway/bodies.py), without its model: the gateway loads no pydantic."""
    return json.dumps({"reason": reason, "message": message, "invocationId": inv}).encode()


def share_limit(capacity: int, percent: int) -> int:
    """Attempts a target of `capacity` concurrency may have at once: `percent` of it, rounded down
    (sync keeps the rest), and at least one (a target of concurrency one, or none Ready yet)."""
    return max(1, capacity * percent // 100)


def timeout_of(timeout_ms: int) -> float:
    """The attempt's timeout in seconds, bounded as a sync invoke's X-Kruntime-Timeout."""
    if timeout_ms == 0:
        return float(DEFAULT_INVOKE_TIMEOUT_SECONDS)
    if timeout_ms > MAX_INVOKE_TIMEOUT_SECONDS * 1000:
        raise BadRequest(
            f"the timeout must be in (0, {MAX_INVOKE_TIMEOUT_SECONDS}] seconds", reason=R.INVALID_TIMEOUT
        )
    return timeout_ms / 1000


def payload_of(body: bytes) -> bytes:
    if len(body) > MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge(f"the body is larger than {MAX_PAYLOAD_BYTES} bytes")
    return check_json(body)


class DispatchService(gd_grpc.GatewayDispatchServicer):
    """AttemptInvocation over the sync invoke's own handlers (built here, as gateway/app.py builds
    the HTTP ones, over the same route cache, upstreams and balancer)."""

    def __init__(
        self,
        *,
        routes: RouteCache,
        known: KnownRuns,
        upstreams: Upstreams,
        balancer: Balancer,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        authorizer: Authorizer = _NoCallers()
        self.runs = InvokeHandler(routes=routes, known=known, authorizer=authorizer, upstreams=upstreams)
        self.functions = FunctionInvokeHandler(
            routes=routes, known=known, authorizer=authorizer, upstreams=upstreams, balancer=balancer
        )
        self.balancer = balancer
        self.metrics = balancer.metrics
        self.max_in_flight = max_in_flight
        self._held: dict[str, int] = {}  # target uid → its attempts now (entries at 0 are dropped)
        self._in_flight = 0

    def held(self, target_uid: str) -> int:
        """This gateway's async attempts of a target now."""
        return self._held.get(target_uid, 0)

    async def AttemptInvocation(
        self,
        request: gd.AttemptInvocationRequest,
        context: grpc.aio.ServicerContext[gd.AttemptInvocationRequest, gd.AttemptInvocationResponse],
    ) -> gd.AttemptInvocationResponse:
        problem = _malformed(request)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
            raise AssertionError("unreachable: abort raises")
        started = time.perf_counter()
        try:
            outcome = await self.attempt(request)
        except asyncio.CancelledError:  # the worker's call ended first: counted, never answered
            closed = R.CLIENT_CLOSED_REQUEST
            self._observe(request, Outcome(closed.status, str(closed), b"", True), started)
            raise
        self._observe(request, outcome, started)
        return gd.AttemptInvocationResponse(
            http_status=outcome.status,
            reason=outcome.reason,
            body=outcome.body,
            dispatched=outcome.dispatched,
        )

    def _observe(self, request: gd.AttemptInvocationRequest, outcome: Outcome, started: float) -> None:
        if self.metrics is not None:
            self.metrics.async_attempts.labels(request.target_kind, str(outcome.status), outcome.reason).inc()
        level = logging.INFO if outcome.status < 500 else logging.WARNING
        if log.isEnabledFor(level):
            log.log(
                level,
                "async attempt",
                extra={
                    "status": outcome.status,
                    "reason": outcome.reason,
                    "dispatched": outcome.dispatched,
                    "kind": request.target_kind,
                    "target_uid": request.target_uid if is_run_uid(request.target_uid) else "",
                    "invocation_id": _logged_id(request.invocation_id),
                    "attempt": request.attempt,
                    "ms": round((time.perf_counter() - started) * 1000, 3),
                },
            )

    async def attempt(self, request: gd.AttemptInvocationRequest) -> Outcome:
        """One attempt (its request well-formed: `_malformed` says nothing), as a sync invoke runs it."""
        try:
            inv = validate_invocation_id(request.invocation_id)
        except ValueError as exc:
            return error_outcome(BadRequest(str(exc), reason=R.INVALID_INVOCATION_ID), "")
        share = request.share_percent or DEFAULT_SHARE_PERCENT
        # Done once the worker's call ends first (it hung up, or its deadline passed): the attempt
        # is withdrawn as a sync caller's that hangs up (out of the host's queue or the balancer's
        # wait, never run for nobody), in its own task, since the call's task is cancelled.
        lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        run = self._run if request.target_kind == RUN else self._function
        task = asyncio.ensure_future(run(request, inv, share, lost))
        task.add_done_callback(_retrieved)
        try:
            body = await asyncio.shield(task)
        except asyncio.CancelledError:
            if not lost.done():
                lost.set_result(None)
            raise
        except GatewayError as error:
            return error_outcome(error, inv)
        except _ShareFull as full:
            reason = R.ASYNC_SHARE_FULL
            return Outcome(reason.status, str(reason), _error_body(str(reason), str(full), inv), False)
        except Exception:  # a bug of the gateway, as the HTTP middleware answers one: it may have run
            log.exception("async attempt failed", extra={"invocation_id": inv})
            return error_outcome(GatewayError("internal error"), inv)
        return Outcome(200, "", body, True)

    async def _run(
        self, request: gd.AttemptInvocationRequest, inv: str, share: int, lost: asyncio.Future[None]
    ) -> bytes:
        namespace, runtime, uid = request.namespace, request.runtime, request.target_uid
        route = await self.runs.find_route(namespace, runtime, uid)
        if route is None:
            raise self.runs.missing(namespace, runtime, uid)[0]
        if not route.ready:
            raise RunNotReady("the Run is registered but not ready", reason=R.RUN_NOT_READY)
        timeout_s = timeout_of(request.timeout_ms)
        payload = payload_of(request.body)
        share = route.async_share or share  # the host's word for the spec first (an older one: the worker's)
        with self._hold(uid, share_limit(route.concurrency, share)):
            return await self.runs.deliver(route, inv, payload, timeout_s, lost=lost)

    async def _function(
        self, request: gd.AttemptInvocationRequest, inv: str, share: int, lost: asyncio.Future[None]
    ) -> bytes:
        namespace, uid = request.namespace, request.target_uid
        seen, known = self.functions.lookup(uid, namespace)
        if seen is None and known is None:
            raise self.functions.unknown(uid)
        timeout_s = timeout_of(request.timeout_ms)
        payload = payload_of(request.body)
        wake = self.balancer.wake_target(uid, namespace, seen)
        share = self.functions.routes.function_async_policy(uid)[1] or share  # as a Run's, above
        with self._hold(uid, share_limit(self.balancer.capacity(uid, namespace), share)):
            return await self.functions.deliver_function(
                uid, namespace, inv, payload, timeout_s, lost=lost, wake=wake
            )

    @contextlib.contextmanager
    def _hold(self, uid: str, limit: int) -> Iterator[None]:
        """One of the target's `limit` async places, held while the attempt runs; _ShareFull if
        they are all held."""
        held = self._held.get(uid, 0)
        if held >= limit:
            raise _ShareFull(
                "the target's async invocations hold their share of its concurrency; it did not run, "
                "retried later"
            )
        if self._in_flight >= self.max_in_flight:
            raise _ShareFull(
                "the gateway runs as many async attempts as it may; it did not run, retried later"
            )
        self._held[uid] = held + 1
        self._in_flight += 1
        if self.metrics is not None:
            self.metrics.async_in_flight.inc()
        try:
            yield
        finally:
            self._in_flight -= 1
            if self.metrics is not None:
                self.metrics.async_in_flight.dec()
            left = self._held.get(uid, 0) - 1
            if left > 0:
                self._held[uid] = left
            else:
                self._held.pop(uid, None)


def _malformed(request: gd.AttemptInvocationRequest) -> str:
    """What no sync request could carry ("" if nothing): the control plane's bug, never answered
    as an HTTP status. The uid, the id, the body and the timeout are answered as a sync invoke's."""
    if request.target_kind not in (RUN, FUNCTION):
        return "target_kind must be Run or Function"
    try:
        validate_dns1123_label(request.namespace, field="namespace")
        if request.target_kind == RUN:
            validate_dns1123_label(request.runtime, field="runtime")
    except ValueError:
        return "the namespace or the runtime is not a DNS-1123 label"
    if request.target_kind == FUNCTION and request.runtime:
        return "a Function's attempt names no runtime"
    if request.share_percent > 100:
        return "share_percent must be at most 100"
    if request.attempt < 1:
        return "attempt must be at least 1"
    return ""


def _retrieved(task: asyncio.Future[bytes]) -> None:
    """An attempt whose caller went away ends on its own (ClientAborted): nobody awaits it."""
    if not task.cancelled():
        task.exception()


def _logged_id(value: str) -> str:
    try:
        return validate_invocation_id(value)
    except ValueError:
        return ""


__all__ = ["DEFAULT_SHARE_PERCENT", "NOT_DISPATCHED", "DispatchService", "Outcome", "share_limit"]
