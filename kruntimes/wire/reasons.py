"""Every stable reason string, each with the status it is answered with: one table per side.

A reason is the machine-readable half of an error answer. Callers dispatch on it, so a published
reason never changes meaning, and each is spelled only here.

    HostReason      the Runtime Server's refusals (gRPC and the invoke port), each with its gRPC
                    status code; the reason travels in the trailing metadata key `krt-reason`
                    (`TRAILER_KEY`), written by `trailer` and read by `reason_of`, and in the
                    invoke port's error frames (kruntimes.wire.frames)
    GatewayReason   the gateway's HTTPS answers, each with its HTTP status and Retry-After hint;
                    the `reason` of the JSON error body

gRPC status codes are kept here as their names ("FAILED_PRECONDITION"), not as grpc.StatusCode:
this module imports only the standard library, so workflow code may import it (RunWorkflow's
non-retryable registration errors are derived from `HostReason`) and workflows never import grpc.
The name is also the code's wire form: the invoke port's error frame carries the code by name. The
runtime host turns the names into grpc.StatusCode once, at import (runtime/service.py), and a test
checks that every name here is a grpc.StatusCode member.

Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

# the trailing metadata key of a host's gRPC error answers that carries its HostReason
TRAILER_KEY = "krt-reason"
# The adapter's error class behind a reason (a load failure's kind), beside it in the trailer.
ERROR_CLASS_KEY = "krt-error-class"


class HostReason(StrEnum):
    """The Runtime Server's reasons: (reason, gRPC status code name, when, refuses_registration,
    final).

    `refuses_registration`: RegisterFunction refuses the function itself (its source, handler or
    config, or its attempt): retrying the same call cannot change the answer, so only the Run's
    own retry policy (a new attempt) may help.
    `final`: not even a new attempt can: the same Run's source, handler and config always get
    this answer, so the Run fails at once (its retry policy is for what may pass next time).
    """

    code: str
    when: str
    refuses_registration: bool
    final: bool

    def __new__(
        cls, reason: str, code: str, when: str, refuses_registration: bool = False, final: bool = False
    ) -> HostReason:
        member = str.__new__(cls, reason)
        member._value_ = reason
        member.code = code
        member.when = when
        member.refuses_registration = refuses_registration
        member.final = final
        return member

    HANDLER_LOAD_FAILED = (
        "HandlerLoadFailed",
        "FAILED_PRECONDITION",
        "the handler cannot be loaded (an import or syntax error, no such function)",
        True,
        True,
    )
    HANDLER_LOAD_INTERRUPTED = (
        "HandlerLoadInterrupted",
        "FAILED_PRECONDITION",
        "the function process exited or timed out while loading the handler",
        True,
    )
    SOURCE_INVALID = ("SourceInvalid", "INVALID_ARGUMENT", "the source cannot be prepared", True, True)
    INVALID_REQUEST = (
        "InvalidRequest",
        "INVALID_ARGUMENT",
        "a field is missing or out of bounds",
        True,
        True,
    )
    SECRET_NOT_FOUND = (
        "SecretNotFound",
        "FAILED_PRECONDITION",
        "a secret the Run's envFrom names does not exist on the host",
        True,
    )
    SECRET_FORBIDDEN = (
        "SecretForbidden",
        "PERMISSION_DENIED",
        "the Run's creator is not bound to use a secret its envFrom names (role bindings' "
        "use-secrets), or the Run has no creator",
        True,
        True,
    )
    REGISTRATION_CONFLICT = (
        "RegistrationConflict",
        "FAILED_PRECONDITION",
        "the same attempt is registered with another config",
        True,
    )
    STALE_ATTEMPT = ("StaleAttempt", "FAILED_PRECONDITION", "a lower attempt than the current one", True)
    FENCE_MISMATCH = (
        "FenceMismatch",
        "FAILED_PRECONDITION",
        "the caller expected another run, attempt or host",
    )
    ASSIGNMENT_INVALID = (
        "AssignmentInvalid",
        "PERMISSION_DENIED",
        "the signed assignment is missing, forged, or names another run, attempt or host",
        True,
    )
    PERMISSION_DENIED = (
        "PermissionDenied",
        "PERMISSION_DENIED",
        "the caller's platform identity (its certificate's role) may not call this method",
    )
    NOT_READY = ("NotReady", "UNAVAILABLE", "the registration cannot serve (a fatal error)")
    UNKNOWN_REGISTRATION = ("UnknownRegistration", "NOT_FOUND", "no such registration id")
    CONCURRENCY_LIMIT = (
        "ConcurrencyLimit",
        "RESOURCE_EXHAUSTED",
        "the function runs as many invocations as its concurrency and its queue is full",
    )
    QUEUE_TIMEOUT = (
        "QueueTimeout",
        "RESOURCE_EXHAUSTED",
        "the invocation waited in the function's queue for its queue timeout (or its own) and never ran",
    )
    HOST_BUSY = (
        "HostBusy",
        "RESOURCE_EXHAUSTED",
        "the host runs as many invocations as its bound allows (krt host --max-invocations)",
    )
    HOST_UNAVAILABLE = ("HostUnavailable", "UNAVAILABLE", "the host is shutting down or cannot spawn")
    INTERNAL = ("Internal", "INTERNAL", "the host failed unexpectedly (logged there)")


class GatewayReason(StrEnum):
    """The gateway's reasons: (reason, HTTP status, when, retry_after, invoke).

    `retry_after`: the Retry-After seconds the answer carries unless its call site knows better;
    None: no Retry-After. `invoke`: an answer of the invoke operation (documented under it in
    /openapi.json); False: the router's answer to a path or method outside the API, or a label
    that is never answered (ClientClosedRequest: the caller went away before the answer, counted
    and logged with the status 499).
    """

    status: int
    when: str
    retry_after: int | None
    invoke: bool

    def __new__(
        cls, reason: str, status: int, when: str, retry_after: int | None = None, invoke: bool = True
    ) -> GatewayReason:
        member = str.__new__(cls, reason)
        member._value_ = reason
        member.status = status
        member.when = when
        member.retry_after = retry_after
        member.invoke = invoke
        return member

    INVALID_INVOCATION_ID = (
        "InvalidInvocationId",
        400,
        "the invocation id is over 128 bytes or not printable ASCII",
    )
    MALFORMED_JSON = ("MalformedJSON", 400, "the body is not a JSON document")
    INVALID_TIMEOUT = ("InvalidTimeout", 400, "the timeout is not a number of seconds in (0, 900]")
    INVALID_REQUEST = ("InvalidRequest", 400, "the owner refused the request as invalid; it did not run")
    MALFORMED_REQUEST = (
        "MalformedRequest",
        400,
        "the HTTP request cannot be parsed (request line, a header, the body's framing); never echoed",
    )
    INVALID_CALLBACK_URL = (
        "InvalidCallbackURL",
        400,
        "X-Kruntime-Callback-URL is not an https URL with a host and no user (at most 2,048 bytes), or "
        "was sent on a sync invoke; nothing was recorded",
    )
    UNAUTHENTICATED = ("Unauthenticated", 401, "no, malformed, unknown or rejected bearer token")
    FORBIDDEN = ("Forbidden", 403, "the caller may not `get` this Run (or Function)")
    CALLBACK_NOT_ALLOWED = (
        "CallbackNotAllowed",
        403,
        "an async invocation's X-Kruntime-Callback-URL names an origin the gateway's --callback-origins "
        "does not allow for the target's namespace; nothing was recorded",
    )
    RUN_NOT_FOUND = ("RunNotFound", 404, "unknown uid, or not of this namespace and runtime")
    FUNCTION_NOT_FOUND = (
        "FunctionNotFound",
        404,
        "a Function's URL: no replica of a Function of this uid in this namespace was ever seen",
    )
    INVOCATION_NOT_FOUND = (
        "InvocationNotFound",
        404,
        "an async invocation's URL: no invocation of this id for this target (never submitted, or "
        "forgotten after its retention)",
    )
    INVOCATION_CONFLICT = (
        "InvocationConflict",
        409,
        "an async invocation of this id was accepted with another body (SHA-256 compared) within "
        "its retention; the function was not run again",
    )
    PAYLOAD_TOO_LARGE = ("PayloadTooLarge", 413, "the body is over 1 MiB (refused before it is read whole)")
    REQUEST_BODY_TIMEOUT = (
        "RequestBodyTimeout",
        408,
        "the body arrived slower than the gateway's minimum rate; the connection is closed",
    )
    FUNCTION_BUSY = (
        "FunctionBusy",
        429,
        "the function runs as many invocations as its concurrency and its queue is full; it did not run",
        1,
    )
    QUEUE_TIMEOUT = (
        "QueueTimeout",
        429,
        "the invocation waited its turn for the function's queue timeout (or its own timeout) and "
        "never ran: safe to retry",
        1,
    )
    HOST_BUSY = (
        "HostBusy",
        429,
        "the function's host runs as many invocations as it may (its --max-invocations); it did not run",
        1,
    )
    REPLICAS_FULL = (
        "ReplicasFull",
        429,
        "a Function's URL: every Ready replica runs as many invocations as its concurrency and the "
        "gateway's wait for the Function is full; it did not run",
        1,
    )
    ASYNC_BACKLOG_FULL = (
        "AsyncBacklogFull",
        429,
        "an async invocation: the target's or the namespace's Queued invocations are at their bound; "
        "nothing was recorded",
        5,
    )
    INTERNAL_ERROR = ("InternalError", 500, "a bug in the gateway (logged); the function may have run")
    OWNER_UNREACHABLE = ("OwnerUnreachable", 502, "the owner failed after dispatch; never retried")
    FUNCTION_PROCESS_EXITED = (
        "FunctionProcessExited",
        502,
        "the function's process exited during the invocation; never retried",
    )
    MALFORMED_OWNER_ANSWER = (
        "MalformedOwnerAnswer",
        502,
        "the owner's answer broke the invoke contract (outputs not a bounded JSON object, an unknown "
        "status, another invocation's id); never passed on, never retried",
    )
    RUN_NOT_READY = ("RunNotReady", 503, "the Run is known but not ready, or cannot serve right now", 1)
    NO_READY_REPLICA = (
        "NoReadyReplica",
        503,
        "a Function's URL: the Function is known but has no Ready replica now; it did not run",
        2,
    )
    ROUTE_STALE = ("RouteStale", 503, "the Run's registration moved to another generation", 1)
    OWNER_UNAVAILABLE = (
        "OwnerUnavailable",
        503,
        "the request could not be delivered to the owner (refused, TLS failed, route gone); "
        "it did not run: safe to retry",
        1,
    )
    AUTHORIZATION_UNAVAILABLE = (
        "AuthorizationUnavailable",
        503,
        "the authorization decision could not be made (never an allow)",
        1,
    )
    ASYNC_UNAVAILABLE = (
        "AsyncUnavailable",
        503,
        "an async invocation: Temporal could not record (or read) it; nothing was recorded, safe to "
        "retry with the same id",
        2,
    )
    INVOCATION_TIMEOUT = ("InvocationTimeout", 504, "the function did not finish within its timeout")
    OWNER_TIMEOUT = ("OwnerTimeout", 504, "the owner did not answer in time; the function may have run")
    # the router's answers (aiohttp's, made JSON)
    NOT_FOUND = ("NotFound", 404, "no such path", None, False)
    METHOD_NOT_ALLOWED = ("MethodNotAllowed", 405, "the path does not take this method", None, False)
    # an async attempt's answer only (GatewayDispatch.AttemptInvocation), never an HTTP one
    ASYNC_SHARE_FULL = (
        "AsyncShareFull",
        429,
        "an async attempt: the target's async attempts hold their share of its concurrency; it did not run",
        1,
        False,
    )
    # never answered: the caller closed the connection before the answer (metrics and logs only)
    CLIENT_CLOSED_REQUEST = (
        "ClientClosedRequest",
        499,
        "the caller closed the connection before the answer (never sent)",
        None,
        False,
    )


# The error classes a runtime host's adapters report for a failed invocation or task (and, as
# HandlerLoadFailed's kind, a load). A function process writes its own error frames, so any
# other class it reports is shown as none of these: a plain-text message names only these.
ADAPTER_ERRORS = frozenset(
    {
        "HandlerError",
        "HandlerImportError",
        "HandlerNotFound",
        "HandlerNotCallable",
        "InvalidOutput",
        "InvalidPayload",
        "ProcessExited",
        "Timeout",
        "Cancelled",
    }
)

_HOST = {str(r): r for r in HostReason}
_GATEWAY = {str(r): r for r in GatewayReason}


def host_reason(reason: str) -> HostReason | None:
    """The HostReason spelled `reason`, if there is one."""
    return _HOST.get(reason)


def gateway_reason(reason: str) -> GatewayReason | None:
    """The GatewayReason spelled `reason`, if there is one."""
    return _GATEWAY.get(reason)


def registration_refusals() -> list[str]:
    """The reasons with which RegisterFunction refuses the function itself, in table order."""
    return [str(r) for r in HostReason if r.refuses_registration]


def final_refusals() -> list[str]:
    """The registration refusals that a new attempt of the same Run always gets too."""
    return [str(r) for r in HostReason if r.final]


def trailer(reason: str, *, error_class: str = "") -> tuple[tuple[str, str], ...]:
    """The trailing metadata of a host's gRPC error answer with `reason`, and the adapter's error
    class behind it (a HandlerLoadFailed's kind) when it is one of ADAPTER_ERRORS."""
    if error_class in ADAPTER_ERRORS:
        return ((TRAILER_KEY, str(reason)), (ERROR_CLASS_KEY, error_class))
    return ((TRAILER_KEY, str(reason)),)


def error_class_of(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The adapter's error class in a host's gRPC error answer, if it is one of ADAPTER_ERRORS;
    "" otherwise (none given, or a class this catalogue does not name)."""
    for key, value in metadata or ():
        if key == ERROR_CLASS_KEY:
            found = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            return found if found in ADAPTER_ERRORS else ""
    return ""


def reason_of(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The host's reason in a gRPC answer's trailing metadata (any iterable of key/value pairs, as
    grpc and grpc.aio give them); "" when there is none."""
    for key, value in metadata or ():
        if key == TRAILER_KEY:
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return ""
