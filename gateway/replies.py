"""The gateway's error answers as HTTP responses: every one an `ErrorBody` (gateway/bodies.py)
with the status of its reason (kruntimes.wire.reasons.GatewayReason), the invocation id header when
there is an id, and Retry-After when the reason says when to retry.

Used by the application's middleware (gateway/app.py) and by the connection's own answers to
requests that never reach the application (gateway/listener.py: the HTTP parser's refusals).
"""

from __future__ import annotations

from aiohttp import web

from kruntimes.gateway.errors import GatewayError
from kruntimes.wire import headers
from kruntimes.wire.reasons import GatewayReason

# the router's refusals by status (kruntimes.wire.reasons: the reasons outside the invoke operation)
_ROUTER = {r.status: r for r in GatewayReason if not r.invoke}


def error_answer(
    *, status: int, reason: str, message: str, invocation_id: str, retry_after: int | None = None
) -> web.Response:
    """An error answer: the ErrorBody, the invocation id header when there is an id, Retry-After."""
    body = {"reason": reason, "message": message, "invocationId": invocation_id}  # an ErrorBody
    answer_headers = {headers.INVOCATION_ID: invocation_id} if invocation_id else {}
    if retry_after is not None:
        answer_headers[headers.RETRY_AFTER] = str(retry_after)
    return web.json_response(body, status=status, headers=answer_headers)


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


__all__ = ["error_answer", "gateway_error_answer", "router_reason"]
