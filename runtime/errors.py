"""The Runtime Server's errors. Each has a stable `reason` used in gRPC details and by callers.

RuntimeError_
 ├── RegistrationConflict   same attempt, different config            FAILED_PRECONDITION
 ├── StaleAttempt           lower attempt than the current one         FAILED_PRECONDITION
 ├── FenceMismatch          caller expected another run/attempt/host   FAILED_PRECONDITION
 ├── NotReady               registration cannot serve (fatal error)    UNAVAILABLE
 ├── UnknownRegistration    no such registration id                    NOT_FOUND
 ├── ConcurrencyLimit       the one in-flight invocation is busy       RESOURCE_EXHAUSTED
 ├── InvalidRequest         a field is missing or out of bounds        INVALID_ARGUMENT
 ├── SourceInvalid          the source cannot be prepared              INVALID_ARGUMENT
 ├── HandlerLoadFailed      the handler cannot be loaded               FAILED_PRECONDITION
 └── HostUnavailable        the host is shutting down or cannot spawn  UNAVAILABLE
"""

from __future__ import annotations


class RuntimeError_(Exception):
    reason = "RuntimeError"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


class RegistrationConflict(RuntimeError_):
    reason = "RegistrationConflict"


class StaleAttempt(RuntimeError_):
    reason = "StaleAttempt"


class FenceMismatch(RuntimeError_):
    reason = "FenceMismatch"


class NotReady(RuntimeError_):
    reason = "NotReady"


class UnknownRegistration(RuntimeError_):
    reason = "UnknownRegistration"


class ConcurrencyLimit(RuntimeError_):
    reason = "ConcurrencyLimit"


class InvalidRequest(RuntimeError_):
    reason = "InvalidRequest"


class SourceInvalid(RuntimeError_):
    reason = "SourceInvalid"


class HandlerLoadFailed(RuntimeError_):
    reason = "HandlerLoadFailed"

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


class HostUnavailable(RuntimeError_):
    reason = "HostUnavailable"
