"""Every error the SDK raises::

    KruntimesError
     ├── ConfigError        Temporal or the gateway cannot be reached, or the config is unusable
     ├── RunNotFound        no Run of that name in that namespace
     ├── HostNotFound       no pool host of that name (or it has no supervisor to act on it)
     ├── RunAlreadyExists   create: a Run of that name is running
     ├── RuntimeNotFound    create, schedule create: no runtime of that name is served; .runtimes
     ├── SpecConflict       apply: a running Run of that name has another spec (spec is immutable)
     ├── WaitTimeout        wait/delete, functions.wait_ready: the wanted phase did not come in time;
     │                      invocations.wait: the invocation did not end in time
     ├── RunFailed          wait: the Run ended (Failed, Timeout, Cancelled) instead; .phase .message
     ├── FunctionConflict   functions.apply: a Function of that name exists with another uid, or
     │                      the Function refused the change (rollback with no earlier revision)
     ├── ScheduleNotFound   no schedule of that name in that namespace
     ├── ScheduleAlreadyExists  schedule create: one of that name exists
     ├── InvalidSchedule    schedule create: a bad name, cron expression, interval or template
     └── InvokeError        an invocation was refused or failed; .status .reason .invocation_id
          ├── Busy               429: the function (or its host) runs as many invocations as it takes, or
          │                      one waited its turn too long; it did not run; .retry_after
          │    └── AsyncBacklogFull   invoke_async: the target's or namespace's Queued invocations are
          │                           at their bound; nothing was recorded; .retry_after
          ├── FunctionNotFound   404: no such function (unknown, finished, or not a function Run);
          │                      also no Function object of that name (.namespace .name set)
          ├── NotReady           503: known but not ready now; .retry_after
          │    └── AsyncUnavailable   invoke_async, invocations: Temporal could not record or read it;
          │                           nothing was recorded: safe to submit again with the same id
          ├── InvocationConflict 409: invoke_async: the same invocation id with another body
          ├── InvocationNotFound 404: invocations: no invocation of that id (never submitted, or
          │                      forgotten after its target's retention)
          ├── Unauthorized       401/403: the token is missing, unknown, or not allowed here
          ├── PayloadRejected    400/413: bad invocation id, timeout, JSON, or a body over 1 MiB
          ├── OutcomeUnknown     500/502/504, or the connection broke after sending: the function
          │                      may have run; the SDK never retries it
          └── InvocationFailed   200 with HandlerError/InvalidOutput; .result holds the answer

Library errors (temporalio, aiohttp) are wrapped with ``raise ... from e`` and never leak.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from kruntimes.api.phases import RunPhase
    from kruntimes.sdk.results import InvokeResult, RunObject


class KruntimesError(Exception):
    """Every error the SDK raises."""


class ConfigError(KruntimesError):
    pass


class _Named(KruntimesError):
    """An error about the object `name` in `namespace`; the class's `text` says it (a format
    string of both)."""

    text: ClassVar[str]

    def __init__(self, namespace: str, name: str) -> None:
        super().__init__(self.text.format(namespace=namespace, name=name))
        self.namespace = namespace
        self.name = name


class RunNotFound(_Named):
    text = "run {name!r} not found in namespace {namespace!r}"


class HostNotFound(KruntimesError):
    def __init__(self, name: str, why: str = "") -> None:
        super().__init__(f"host {name!r} not found" + (f": {why}" if why else ""))
        self.name = name


class ScheduleNotFound(_Named):
    text = "schedule {name!r} not found in namespace {namespace!r}"


class ScheduleAlreadyExists(_Named):
    text = "schedule {name!r} already exists in namespace {namespace!r}"


class InvalidSchedule(KruntimesError, ValueError):
    """A schedule's name, cron expression, interval, overlap or template is not acceptable."""


class RunAlreadyExists(_Named):
    text = "run {name!r} already exists in namespace {namespace!r}"


class RuntimeNotFound(KruntimesError):
    def __init__(self, runtime: str, runtimes: list[str]) -> None:
        there = f"the runtimes are: {', '.join(runtimes)}" if runtimes else "the platform serves none"
        super().__init__(f"no runtime {runtime!r} is configured; {there}")
        self.runtime = runtime
        self.runtimes = tuple(runtimes)


class SpecConflict(KruntimesError):
    def __init__(self, namespace: str, name: str, fields: list[str]) -> None:
        super().__init__(
            f"run {name!r} in namespace {namespace!r} exists with another {', '.join(fields)}; "
            "a Run's spec is immutable"
        )
        self.namespace = namespace
        self.name = name
        self.fields = tuple(fields)


class FunctionConflict(KruntimesError):
    """A Function refused a change: another uid under the same name (a deleted and re-created
    Function is another one), or a rollback with no earlier revision."""

    def __init__(self, namespace: str, name: str, message: str) -> None:
        super().__init__(f"function {name!r} in namespace {namespace!r}: {message}")
        self.namespace = namespace
        self.name = name


class WaitTimeout(KruntimesError):
    def __init__(self, message: str, *, phase: RunPhase | None = None) -> None:
        super().__init__(message)
        self.phase = phase


class RunFailed(KruntimesError):
    def __init__(self, run: RunObject) -> None:
        status = run.status
        # the reason when it says more than the phase (HandlerLoadFailed, IdleTimeout; not Cancelled)
        reason = next((c.reason for c in status.conditions if c.type == "Ready"), "")
        said = [reason] if reason and reason != status.phase.value else []
        detail = "".join(f": {part}" for part in [*said, status.message] if part)
        super().__init__(f"run {run.metadata.name!r} ended {status.phase.value}{detail}")
        self.run = run
        self.phase = status.phase
        self.message = status.message


class InvokeError(KruntimesError):
    def __init__(self, status: int, reason: str, message: str, *, invocation_id: str) -> None:
        super().__init__(f"{reason}: {message}" if message else reason)
        self.status = status
        self.reason = reason
        self.message = message
        self.invocation_id = invocation_id


class _RetryLater(InvokeError):
    """A refusal that names when to try again (Retry-After, in seconds)."""

    def __init__(
        self, status: int, reason: str, message: str, *, invocation_id: str, retry_after: float
    ) -> None:
        super().__init__(status, reason, message, invocation_id=invocation_id)
        self.retry_after = retry_after


class Busy(_RetryLater):
    pass


class FunctionNotFound(InvokeError):
    """404 from the gateway, or a target that is no function; from `client.functions`, no Function
    of that name (then ``namespace`` and ``name`` say which)."""

    namespace = ""
    name = ""

    @classmethod
    def named(cls, namespace: str, name: str) -> FunctionNotFound:
        """No Function object `name` in `namespace` (nothing was invoked)."""
        text = f"function {name!r} not found in namespace {namespace!r}"
        from kruntimes.wire.reasons import GatewayReason

        error = cls(404, GatewayReason.FUNCTION_NOT_FOUND.value, text, invocation_id="")
        error.args = (text,)  # the sentence alone, without the reason in front
        error.namespace, error.name = namespace, name
        return error


class NotReady(_RetryLater):
    pass


class AsyncBacklogFull(Busy):
    pass


class AsyncUnavailable(NotReady):
    pass


class InvocationConflict(InvokeError):
    pass


class InvocationNotFound(InvokeError):
    pass


class Unauthorized(InvokeError):
    pass


class PayloadRejected(InvokeError):
    pass


class OutcomeUnknown(InvokeError):
    pass


class InvocationFailed(InvokeError):
    def __init__(self, result: InvokeResult) -> None:
        error = result.error or {}
        message = ": ".join(str(error[k]) for k in ("type", "message") if error.get(k))
        super().__init__(200, result.status, message, invocation_id=result.invocationId)
        self.result = result
