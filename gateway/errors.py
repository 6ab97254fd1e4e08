"""The gateway's errors: one tree, one stable reason each (kruntimes.wire.reasons.GatewayReason,
which gives its HTTP status and Retry-After), mapped to an HTTP answer in one place (the
middleware in gateway/app.py).

GatewayError                    500  InternalError        (also any exception nobody expected)
 ├── BadRequest                 400  InvalidRequest | InvalidInvocationId | MalformedJSON | InvalidTimeout
 │                                   | MalformedRequest (the HTTP parser's refusals, gateway/listener.py)
 ├── AuthError                       the Authorizer's refusals (kruntimes.gateway.auth)
 │    ├── Unauthenticated       401  Unauthenticated
 │    ├── Forbidden             403  Forbidden
 │    └── AuthUnavailable       503  AuthorizationUnavailable  (+ Retry-After)
 ├── NotFound                   404  RunNotFound | FunctionNotFound | InvocationNotFound
 ├── Conflict                   409  InvocationConflict (an async invocation's id with another body)
 ├── BodyTimeout                408  RequestBodyTimeout  (the connection is closed after it)
 ├── PayloadTooLarge            413  PayloadTooLarge
 ├── Busy                       429  FunctionBusy | QueueTimeout | HostBusy | ReplicasFull  (+ Retry-After):
 │                                   did not run
 ├── BacklogFull                429  AsyncBacklogFull  (+ Retry-After): nothing recorded
 ├── UpstreamFailed             502  OwnerUnreachable | FunctionProcessExited | MalformedOwnerAnswer
 ├── RunNotReady                503  RunNotReady | RouteStale | NoReadyReplica  (+ Retry-After)
 ├── OwnerUnavailable           503  OwnerUnavailable  (+ Retry-After): not delivered, did not run
 ├── AsyncUnavailable           503  AsyncUnavailable  (+ Retry-After): Temporal could not record it
 └── UpstreamTimeout            504  InvocationTimeout | OwnerTimeout

A class names the reasons it may carry (the first is its default); they all share one status. A
500 is the gateway's own bug; a 502 means the upstream (the owning host or the function's
process) failed. Messages are for people and never contain tokens or internal addresses.

ClientAborted is not an answer: the caller went away before it (counted and logged as
ClientClosedRequest, status 499, at info; never a 5xx).
"""

from __future__ import annotations

from typing import ClassVar

from kruntimes.wire.reasons import GatewayReason as R


class GatewayError(Exception):
    reasons: ClassVar[tuple[R, ...]] = (R.INTERNAL_ERROR,)
    status: ClassVar[int] = R.INTERNAL_ERROR.status
    reason: R = R.INTERNAL_ERROR
    retry_after: int | None = None

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "reasons" in cls.__dict__:
            statuses = {r.status for r in cls.reasons}
            if len(statuses) != 1:
                raise TypeError(f"{cls.__name__}: its reasons are answered with {sorted(statuses)}")
            cls.status = statuses.pop()
            cls.reason = cls.reasons[0]
            cls.retry_after = cls.reason.retry_after

    def __init__(self, message: str, *, reason: R | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            if reason not in self.reasons:
                raise TypeError(f"{type(self).__name__} does not carry {reason}")
            self.reason = reason
            self.retry_after = reason.retry_after
        if retry_after is not None:
            self.retry_after = retry_after


class BadRequest(GatewayError):
    reasons = (
        R.INVALID_REQUEST,
        R.INVALID_INVOCATION_ID,
        R.MALFORMED_JSON,
        R.INVALID_TIMEOUT,
        R.MALFORMED_REQUEST,
        R.INVALID_CALLBACK_URL,
    )


class AuthError(GatewayError):
    """The Authorizer's refusals: raised by kruntimes.gateway.auth, never an allow."""


class Unauthenticated(AuthError):
    reasons = (R.UNAUTHENTICATED,)


class Forbidden(AuthError):
    reasons = (R.FORBIDDEN,)


class AuthUnavailable(AuthError):
    reasons = (R.AUTHORIZATION_UNAVAILABLE,)


class CallbackNotAllowed(GatewayError):
    """A per-request callback URL whose origin the namespace may not name (not an AuthError: the
    caller may invoke the target, just not call back there)."""

    reasons = (R.CALLBACK_NOT_ALLOWED,)


class NotFound(GatewayError):
    reasons = (R.RUN_NOT_FOUND, R.FUNCTION_NOT_FOUND, R.INVOCATION_NOT_FOUND)


class Conflict(GatewayError):
    reasons = (R.INVOCATION_CONFLICT,)


class BodyTimeout(GatewayError):
    reasons = (R.REQUEST_BODY_TIMEOUT,)


class PayloadTooLarge(GatewayError):
    reasons = (R.PAYLOAD_TOO_LARGE,)


class Busy(GatewayError):
    reasons = (R.FUNCTION_BUSY, R.QUEUE_TIMEOUT, R.HOST_BUSY, R.REPLICAS_FULL)


class BacklogFull(GatewayError):
    reasons = (R.ASYNC_BACKLOG_FULL,)


class UpstreamFailed(GatewayError):
    reasons = (R.OWNER_UNREACHABLE, R.FUNCTION_PROCESS_EXITED, R.MALFORMED_OWNER_ANSWER)


class RunNotReady(GatewayError):
    reasons = (R.RUN_NOT_READY, R.ROUTE_STALE, R.NO_READY_REPLICA)


class OwnerUnavailable(GatewayError):
    """The request never reached the owner (refused, TLS failed, route gone): safe to retry."""

    reasons = (R.OWNER_UNAVAILABLE,)


class AsyncUnavailable(GatewayError):
    """Temporal could not record (or read) an async invocation: nothing was recorded."""

    reasons = (R.ASYNC_UNAVAILABLE,)


class UpstreamTimeout(GatewayError):
    reasons = (R.OWNER_TIMEOUT, R.INVOCATION_TIMEOUT)


class ClientAborted(Exception):
    """The caller closed the connection before the answer: nothing to answer, nobody's failure."""


__all__ = [
    "AsyncUnavailable",
    "AuthError",
    "AuthUnavailable",
    "BacklogFull",
    "BadRequest",
    "BodyTimeout",
    "Busy",
    "CallbackNotAllowed",
    "ClientAborted",
    "Conflict",
    "Forbidden",
    "GatewayError",
    "NotFound",
    "OwnerUnavailable",
    "PayloadTooLarge",
    "RunNotReady",
    "Unauthenticated",
    "UpstreamFailed",
    "UpstreamTimeout",
]
