"""The gateway's aiohttp application: routes, the one place errors become HTTP answers (the
`observe` middleware), metrics, and JSON access logs (runtime, run uid, invocation id — never
tokens).

An invoke with `Prefer: respond-async` (RFC 7240; other preferences are ignored) is an async
invocation (gateway/async_invoke.py), as are the `…/invocations` paths under a Run's and a
Function's URL.

Every error answer is an `ErrorBody` (gateway/bodies.py) with the status of its reason
(kruntimes.wire.reasons.GatewayReason): a GatewayError as it says; the router's own refusals
(an unknown path, a method the path does not take) as JSON too; and any other exception, a bug of
the gateway, is logged and answered 500 InternalError (a 502 would blame the upstream). A body
too slow for the minimum rate (408) closes its connection once answered.

A caller that closed its connection before the answer (ClientAborted while its body was read, or
no transport left when the answer is ready) is counted and logged at info with the status 499 and
the reason ClientClosedRequest, whatever the answer would have been: nobody's failure, never a 5xx.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kruntimes.gateway.async_invoke import (
    DEFAULT_MAX_BACKLOG,
    DEFAULT_MAX_TARGET_BACKLOG,
    FUNCTION,
    RUN,
    AsyncInvocations,
)
from kruntimes.gateway.auth import Authorizer
from kruntimes.gateway.callback_origins import CallbackOrigins
from kruntimes.gateway.errors import BadRequest, BodyTimeout, ClientAborted, GatewayError
from kruntimes.gateway.function_invoke import DEFAULT_WARMUP_S, REPLICA, Balancer, FunctionInvokeHandler
from kruntimes.gateway.invoke import INVOCATION_ID, InvokeHandler, Upstreams, logged_target
from kruntimes.gateway.listener import GatewayProtocol, HttpLimits
from kruntimes.gateway.metrics import GatewayMetrics
from kruntimes.gateway.replies import error_answer, gateway_error_answer, router_reason
from kruntimes.gateway.routes import RouteCache
from kruntimes.gateway.visibility import Visibility
from kruntimes.temporal.known_runs import KnownRuns
from kruntimes.wire import headers
from kruntimes.wire.reasons import GatewayReason

# the OpenAPI document, generated from gateway/bodies.py's models by `make openapi`
OPENAPI = Path(__file__).with_name("openapi.json")

__all__ = [
    "ASYNC_INVOCATIONS",
    "GatewayState",
    "build_app",
    "error_answer",
    "gateway_error_answer",
    "prefers_async",
    "router_reason",
]

log = logging.getLogger("gateway")

RUN_PATH = r"/v1/namespaces/{namespace}/runtimes/{runtime}/functions/{uid:[^/:]+}"
FUNCTION_PATH = r"/v1/namespaces/{namespace}/functions/{uid:[^/:]+}"
INVOKE_PATH = RUN_PATH + ":invoke"
FUNCTION_INVOKE_PATH = FUNCTION_PATH + ":invoke"
# an invocation id: anything but "/" once aiohttp decoded it (the id's own rules are checked after)
_INVOCATION = r"/invocations/{id:[^/]+}"
_INVOKES = frozenset(
    {
        "invoke",
        "function_invoke",
        "invocations",
        "invocation",
        "invocation_resubmit",
        "function_invocations",
        "function_invocation",
        "function_invocation_resubmit",
    }
)
# where the access log finds that an invoke was async
ASYNC = web.RequestKey("async_invoke", bool)
# the async handlers (tests reach the Temporal channel through it)
ASYNC_INVOCATIONS = web.AppKey("async_invocations", AsyncInvocations)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_CLOSED = GatewayReason.CLIENT_CLOSED_REQUEST


@dataclass
class GatewayState:
    routes: RouteCache
    known: KnownRuns
    authorizer: Authorizer
    upstreams: Upstreams
    metrics: GatewayMetrics
    ready: Callable[[], bool]
    limits: HttpLimits = HttpLimits()
    balancer: Balancer | None = None  # a Function's replicas (one is made when none is given)
    function_warmup_s: float = DEFAULT_WARMUP_S
    # async invocations: Temporal (None: each is 503 AsyncUnavailable) and the backlog's bounds
    temporal: Visibility | None = None
    max_async_target_backlog: int = DEFAULT_MAX_TARGET_BACKLOG
    max_async_backlog: int = DEFAULT_MAX_BACKLOG
    # the origins a per-request callback URL may name, per namespace (None: none anywhere)
    callback_origins: CallbackOrigins | None = None


def prefers_async(request: web.Request) -> bool:
    """Whether a `Prefer` header asks for `respond-async` (RFC 7240: comma-separated
    preferences, each a token with an optional value and parameters; case-insensitive)."""
    for value in request.headers.getall(headers.PREFER, ()):
        for preference in _preferences(value):
            token = preference.split(";", 1)[0].split("=", 1)[0].strip()
            if token.lower() == headers.RESPOND_ASYNC:
                return True
    return False


def _preferences(value: str) -> list[str]:
    """A Prefer value split at its commas outside quoted strings (one pass): `foo="a,
    respond-async"` is one preference, not two."""
    parts: list[str] = []
    start, quoted, escaped = 0, False, False
    for i, ch in enumerate(value):
        if escaped:
            escaped = False
        elif quoted and ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            parts.append(value[start:i])
            start = i + 1
    parts.append(value[start:])
    return parts


def _route_label(request: web.Request) -> str:
    resource = request.match_info.route.resource
    if resource is None:
        return "unmatched"
    return resource.name or "other"


def build_app(state: GatewayState) -> web.Application:
    metrics = state.metrics

    @web.middleware
    async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        metrics.in_flight.inc()
        reason = ""
        try:
            try:
                response = await handler(request)
            except GatewayError as err:
                reason = err.reason
                response = gateway_error_answer(err, request.get(INVOCATION_ID, ""))
                if isinstance(err, BodyTimeout) and isinstance(request.protocol, GatewayProtocol):
                    response.force_close()
                    request.protocol.close_after_answer()
            except ClientAborted:
                reason = _CLOSED
                response = web.Response(status=_CLOSED.status)
            except web.HTTPException as exc:
                reason = router_reason(exc)
                response = error_answer(
                    status=exc.status, reason=reason, message=exc.reason, invocation_id=""
                )
            except Exception:
                log.exception("unexpected error", extra={"invocation_id": request.get(INVOCATION_ID, "")})
                bug = GatewayError("internal error")
                reason = bug.reason
                response = gateway_error_answer(bug, request.get(INVOCATION_ID, ""))
        finally:
            metrics.in_flight.dec()
        code = response.status
        if request.transport is None:  # the caller is gone: nobody gets this answer
            reason, code = _CLOSED, _CLOSED.status
        route = _route_label(request)
        metrics.observe(route, str(code), reason, time.perf_counter() - started)
        if route in _INVOKES:
            level = logging.INFO if code < 500 else logging.WARNING
            if log.isEnabledFor(level):
                log.log(
                    level,
                    "invoke",
                    extra={
                        "status": code,
                        "reason": reason,
                        **logged_target(request),
                        **({"run_uid": request.get(REPLICA, "")} if route == "function_invoke" else {}),
                        "invocation_id": request.get(INVOCATION_ID, ""),
                        **({"async": True} if request.get(ASYNC) else {}),
                        "ms": round((time.perf_counter() - started) * 1000, 3),
                    },
                )
        return response

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        ready = state.ready()
        return web.json_response(
            {
                "status": "ready" if ready else "starting",
                "routes": len(state.routes),
                "hosts": state.routes.hosts(),
            },
            status=200 if ready else 503,
        )

    async def prometheus(request: web.Request) -> web.Response:
        metrics.routes.set(len(state.routes))
        metrics.hosts.set(state.routes.hosts())
        metrics.functions.set(state.routes.functions())
        return web.Response(
            body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    document = OPENAPI.read_bytes()  # generated by `make openapi` (gateway/openapi.py)

    async def spec(request: web.Request) -> web.Response:
        return web.Response(body=document, content_type="application/json")

    invoke = InvokeHandler(
        routes=state.routes,
        known=state.known,
        authorizer=state.authorizer,
        upstreams=state.upstreams,
        limits=state.limits,
    )
    function_invoke = FunctionInvokeHandler(
        routes=state.routes,
        known=state.known,
        authorizer=state.authorizer,
        upstreams=state.upstreams,
        balancer=state.balancer or Balancer(state.routes, metrics, warmup_s=state.function_warmup_s),
        limits=state.limits,
    )
    async_invocations = AsyncInvocations(
        runs=invoke,
        functions=function_invoke,
        authorizer=state.authorizer,
        temporal=state.temporal,
        limits=state.limits,
        max_target_backlog=state.max_async_target_backlog,
        max_backlog=state.max_async_backlog,
        callback_origins=state.callback_origins,
    )
    app = web.Application(middlewares=[observe], client_max_size=1024 * 1024 + 1)
    app[ASYNC_INVOCATIONS] = async_invocations
    for kind, base, sync, prefix in (
        # the bound coroutine method: aiohttp deprecates handlers that are not coroutine functions
        (RUN, RUN_PATH, invoke.__call__, ""),
        (FUNCTION, FUNCTION_PATH, function_invoke.__call__, "function_"),
    ):
        handlers = async_invocations.handlers(kind)
        app.router.add_post(base + ":invoke", _either(sync, handlers["accept"]), name=f"{prefix}invoke")
        app.router.add_get(base + "/invocations", handlers["list"], name=f"{prefix}invocations")
        app.router.add_get(base + _INVOCATION, handlers["get"], name=f"{prefix}invocation")
        app.router.add_post(
            base + _INVOCATION + ":resubmit", handlers["resubmit"], name=f"{prefix}invocation_resubmit"
        )
    app.router.add_get("/healthz", healthz, name="healthz")
    app.router.add_get("/readyz", readyz, name="readyz")
    app.router.add_get("/metrics", prometheus, name="metrics")
    app.router.add_get("/openapi.json", spec, name="openapi")
    return app


def _either(sync: Handler, async_: Handler) -> Handler:
    """An invoke route: `async_` when the request prefers respond-async, else `sync`."""

    async def invoke(request: web.Request) -> web.StreamResponse:
        if prefers_async(request):
            request[ASYNC] = True
            return await async_(request)
        if headers.CALLBACK_URL in request.headers:  # a sync answer has nobody to call back
            raise BadRequest(
                f"{headers.CALLBACK_URL} is for an async invocation only (send Prefer: respond-async); "
                "a sync invoke answers in its response",
                reason=GatewayReason.INVALID_CALLBACK_URL,
            )
        return await sync(request)

    return invoke
