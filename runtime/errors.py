"""The Runtime Server's errors. Each carries one stable reason of the catalogue
(kruntimes.wire.reasons.HostReason), which also gives its gRPC status code.

RuntimeServerError          Internal               INTERNAL
 ├── RegistrationConflict   same attempt, different config            FAILED_PRECONDITION
 ├── StaleAttempt           lower attempt than the current one         FAILED_PRECONDITION
 ├── FenceMismatch          caller expected another run/attempt/host   FAILED_PRECONDITION
 ├── FunctionNotReady       registration cannot serve (fatal error)    UNAVAILABLE
 ├── UnknownRegistration    no such registration id                    NOT_FOUND
 ├── ConcurrencyLimit       concurrency reached and the queue is full  RESOURCE_EXHAUSTED
 │    ├── QueueTimeout      it waited its longest in the queue         RESOURCE_EXHAUSTED
 │    └── HostBusy          the host's --max-invocations reached       RESOURCE_EXHAUSTED
 ├── InvalidRequest         a field is missing or out of bounds        INVALID_ARGUMENT
 ├── SourceInvalid          the source cannot be prepared              INVALID_ARGUMENT
 ├── SecretNotFound         a secret envFrom names is not on the host  FAILED_PRECONDITION
 ├── SecretForbidden        the Run's creator may not use that secret  PERMISSION_DENIED
 ├── HandlerLoadFailed      the handler cannot be loaded               FAILED_PRECONDITION
 │    └── HandlerLoadInterrupted  its process exited or timed out loading  FAILED_PRECONDITION
 ├── AssignmentInvalid      no valid signed assignment naming this host PERMISSION_DENIED
 ├── PermissionDenied       the caller's role may not call the method  PERMISSION_DENIED
 └── HostUnavailable        the host is shutting down or cannot spawn  UNAVAILABLE
"""

from __future__ import annotations

from typing import ClassVar

from kruntimes.wire.reasons import HostReason

MAX_MESSAGE_CHARS = 1024


class RuntimeServerError(Exception):
    reason: ClassVar[HostReason] = HostReason.INTERNAL

    def __init__(self, message: str) -> None:
        # Bounded, whatever produced it: the message travels in gRPC metadata (8 KiB limits) and
        # the invoke port's error frames, and a long one must never break the transport.
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 1] + "…"
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


class RegistrationConflict(RuntimeServerError):
    reason = HostReason.REGISTRATION_CONFLICT


class StaleAttempt(RuntimeServerError):
    reason = HostReason.STALE_ATTEMPT


class FenceMismatch(RuntimeServerError):
    reason = HostReason.FENCE_MISMATCH


class FunctionNotReady(RuntimeServerError):
    reason = HostReason.NOT_READY


class UnknownRegistration(RuntimeServerError):
    reason = HostReason.UNKNOWN_REGISTRATION


class ConcurrencyLimit(RuntimeServerError):
    """The invocation was refused for load; it never ran."""

    reason = HostReason.CONCURRENCY_LIMIT


class QueueTimeout(ConcurrencyLimit):
    reason = HostReason.QUEUE_TIMEOUT


class HostBusy(ConcurrencyLimit):
    reason = HostReason.HOST_BUSY


class InvalidRequest(RuntimeServerError):
    reason = HostReason.INVALID_REQUEST


class SourceInvalid(RuntimeServerError):
    reason = HostReason.SOURCE_INVALID


class SecretNotFound(RuntimeServerError):
    reason = HostReason.SECRET_NOT_FOUND


class SecretForbidden(RuntimeServerError):
    """Names the secret, the namespace and the creator; never a value or a path."""

    reason = HostReason.SECRET_FORBIDDEN


class HandlerLoadFailed(RuntimeServerError):
    """`kind` is the adapter's error class (HandlerImportError, HandlerNotFound, ...); the message,
    the adapter's own words, already says what it means."""

    reason = HostReason.HANDLER_LOAD_FAILED

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class HandlerLoadInterrupted(HandlerLoadFailed):
    """The function process exited or timed out while loading: another attempt may load it."""

    reason = HostReason.HANDLER_LOAD_INTERRUPTED


class AssignmentInvalid(RuntimeServerError):
    reason = HostReason.ASSIGNMENT_INVALID


class PermissionDenied(RuntimeServerError):
    reason = HostReason.PERMISSION_DENIED


class HostUnavailable(RuntimeServerError):
    reason = HostReason.HOST_UNAVAILABLE
