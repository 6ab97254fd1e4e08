"""Helpers shared by the workflows: retry policies, error text."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, FailureError

from kruntimes.api.phases import RunPhase


@dataclass
class Recover:
    """RunWorkflow: the host was lost; register elsewhere (a new attempt)."""

    message: str


@dataclass
class Reregister:
    """RunWorkflow: the host no longer serves the registration; register again (the same attempt
    when the host lost it, a new one when it holds it but cannot serve)."""

    message: str
    same_attempt: bool = True


@dataclass
class End:
    """RunWorkflow: how the Run ends (here rather than in the workflow module, which the sandbox
    loads anew for every Run)."""

    phase: RunPhase
    reason: str
    message: str = ""
    outputs: dict[str, object] | None = None


# Transport trouble with a host is retried inside one lifecycle attempt, a bounded number of times.
HOST_CALL_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=5),
    maximum_attempts=6,
)
# Cleanup must finish: it retries longer.
CLEANUP_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=20,
)


def failure_text(err: BaseException) -> str:
    """The innermost message of an activity or child failure, for status.message."""
    while isinstance(err, ActivityError | ChildWorkflowError) and err.cause is not None:
        err = err.cause
    if isinstance(err, FailureError):
        return err.message
    return str(err)


def failure_type(err: BaseException) -> str:
    while isinstance(err, ActivityError | ChildWorkflowError) and err.cause is not None:
        err = err.cause
    if isinstance(err, ApplicationError) and err.type:
        return err.type
    return type(err).__name__
