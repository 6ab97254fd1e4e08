"""The gateway's aiohttp application: routes, the one place errors become HTTP answers (the
`observe` middleware), metrics, and JSON access logs (runtime, run uid, invocation id — never
tokens).

Every error answer is an `ErrorBody` (gateway/bodies.py) with the status of its reason
(kruntimes.wire.reasons.GatewayReason): a GatewayError as it says; the router's own refusals
(an unknown path, a method the path does not take) as JSON too; and any other exception, a bug of
the gateway, is logged and answered 500 InternalError (a 502 would blame the upstream).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway import openapi
from gateway.auth import Authorizer
from gateway.bodies import ErrorBody
from gateway.errors import GatewayError
from gateway.invoke import INVOCATION_ID, InvokeHandler, Upstreams
from gateway.known import KnownRuns
from gateway.metrics import GatewayMetrics
from gateway.routes import RouteCache
from kruntimes.wire import headers
from kruntimes.wire.reasons import GatewayReason

log = logging.getLogger("gateway")

INVOKE_PATH = r"/v1/namespaces/{namespace}/runtimes/{runtime}/functions/{uid:[^/:]+}:invoke"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class GatewayState:
    routes: RouteCache
    known: KnownRuns
    authorizer: Authorizer
    upstreams: Upstreams
    metrics: GatewayMetrics
    ready: Callable[[], bool]


# the router's refusals by status (kruntimes.wire.reasons: the reasons outside the invoke operation)
_ROUTER = {r.status: r for r in GatewayReason if not r.invoke}


def error_answer(
    *, status: int, reason: str, message: str, invocation_id: str, retry_after: int | None = None
) -> web.Response:
    """An error answer: the ErrorBody, the invocation id header when there is an id, Retry-After."""
    body = ErrorBody(reason=reason, message=message, invocationId=invocation_id)
    answer_headers = {headers.INVOCATION_ID: invocation_id} if invocation_id else {}
    if retry_after is not None:
        answer_headers[headers.RETRY_AFTER] = str(retry_after)
    return web.json_response(body.model_dump(), status=status, headers=answer_headers)


def gateway_error_answer(err: GatewayError, invocation_id: str) -> web.Response:
    return error_answer(
        status=err.status,
        reason=err.reason,
        message=err.message,
        invocation_id=invocation_id,
        retry_after=err.retry_after,
    )


def router_reason(exc: web.HTTPException) -> str:
    """The reason of aiohttp's own refusal (404 for an unknown path, 405, ...): the catalogue's
    for the statuses it lists, else the status phrase without spaces."""
    known = _ROUTER.get(exc.status)
    return str(known) if known is not None else exc.reason.replace(" ", "")


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
        route = _route_label(request)
        status = str(response.status)
        metrics.observe(route, status, reason, time.perf_counter() - started)
        if route == "invoke":
            level = logging.INFO if response.status < 500 else logging.WARNING
            if log.isEnabledFor(level):
                log.log(
                    level,
                    "invoke",
                    extra={
                        "status": response.status,
                        "reason": reason,
                        "runtime": request.match_info.get("runtime", ""),
                        "run_uid": request.match_info.get("uid", ""),
                        "invocation_id": request.get(INVOCATION_ID, ""),
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
        return web.Response(
            body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    document = json.dumps(openapi.document()).encode()

    async def spec(request: web.Request) -> web.Response:
        return web.Response(body=document, content_type="application/json")

    invoke = InvokeHandler(
        routes=state.routes, known=state.known, authorizer=state.authorizer, upstreams=state.upstreams
    )
    app = web.Application(middlewares=[observe], client_max_size=1024 * 1024 + 1)
    # the bound coroutine method: aiohttp deprecates handlers that are not coroutine functions
    app.router.add_post(INVOKE_PATH, invoke.__call__, name="invoke")
    app.router.add_get("/healthz", healthz, name="healthz")
    app.router.add_get("/readyz", readyz, name="readyz")
    app.router.add_get("/metrics", prometheus, name="metrics")
    app.router.add_get("/openapi.json", spec, name="openapi")
    return app
