"""Caller-facing gateway errors: one stable `reason` each, mapped to an HTTP status in one place.

GatewayError
 ├── BadRequest            400  InvalidInvocationId | MalformedJSON | ...
 ├── Unauthenticated       401  (gateway.auth)
 ├── Forbidden             403  (gateway.auth)
 ├── NotFound              404  RunNotFound
 ├── PayloadTooLarge       413  PayloadTooLarge
 ├── Busy                  429  FunctionBusy
 ├── UpstreamFailed        502  OwnerUnreachable | FunctionProcessExited
 ├── NotReady              503  RunNotReady | RouteStale | AuthorizationUnavailable  (+ Retry-After)
 └── UpstreamTimeout       504  InvocationTimeout | OwnerTimeout
Messages are for people and never contain tokens or internal addresses.
"""

from __future__ import annotations


class GatewayError(Exception):
    status = 500
    reason = "InternalError"
    retry_after: int | None = None

    def __init__(self, message: str, *, reason: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason
        if retry_after is not None:
            self.retry_after = retry_after


class BadRequest(GatewayError):
    status = 400
    reason = "BadRequest"


class NotFound(GatewayError):
    status = 404
    reason = "RunNotFound"


class PayloadTooLarge(GatewayError):
    status = 413
    reason = "PayloadTooLarge"


class Busy(GatewayError):
    status = 429
    reason = "FunctionBusy"
    retry_after = 1


class UpstreamFailed(GatewayError):
    status = 502
    reason = "OwnerUnreachable"


class NotReady(GatewayError):
    status = 503
    reason = "RunNotReady"
    retry_after = 1


class UpstreamTimeout(GatewayError):
    status = 504
    reason = "OwnerTimeout"
