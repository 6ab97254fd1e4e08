"""The gateway's aiohttp application: routes, the one place errors become HTTP answers, metrics,
and JSON access logs (runtime, run uid, invocation id — never tokens)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway import openapi
from gateway.auth import AuthError, Authorizer
from gateway.errors import GatewayError
from gateway.invoke import INVOCATION_HEADER, INVOCATION_ID, InvokeHandler, Upstreams
from gateway.known import KnownRuns
from gateway.metrics import GatewayMetrics
from gateway.routes import RouteCache

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


def _error_response(err: GatewayError | AuthError, invocation_id: str) -> web.Response:
    body = {"reason": err.reason, "message": str(err.message), "invocationId": invocation_id}
    headers = {INVOCATION_HEADER: invocation_id} if invocation_id else {}
    retry_after = getattr(err, "retry_after", None)
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return web.json_response(body, status=err.status, headers=headers)


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
            except (GatewayError, AuthError) as err:
                reason = err.reason
                response = _error_response(err, request.get(INVOCATION_ID, ""))
            except web.HTTPException as exc:  # aiohttp's own (404 for unknown paths, 405, ...)
                reason = exc.reason.replace(" ", "")
                response = web.json_response(
                    {"reason": reason, "message": exc.reason, "invocationId": ""}, status=exc.status
                )
            except Exception:
                log.exception("unexpected error", extra={"invocation_id": request.get(INVOCATION_ID, "")})
                reason = "InternalError"
                response = web.json_response(
                    {
                        "reason": reason,
                        "message": "internal error",
                        "invocationId": request.get(INVOCATION_ID, ""),
                    },
                    status=502,
                )
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
