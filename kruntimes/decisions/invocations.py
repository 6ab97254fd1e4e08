"""What one attempt of an async invocation leads to (docs/async-invocations.md, "States and
retries"): the InvocationWorkflow's only decision, pure.

    classify(outcome)          what the attempt came to (an AttemptKind)
    decide(outcome, ...)       the invocation's next step: end in a state, or try again after a backoff
    backoff_seconds(n)         the wait before attempt n + 1: 1 s doubling to 60 s

Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal
from urllib.parse import urlsplit

from kruntimes.contracts.invocation import (
    AttemptOutcome,
    InvocationError,
    InvocationPolicy,
    InvocationState,
    TargetKind,
)
from kruntimes.wire.reasons import GatewayReason

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
# Reasons the platform gives of its own (the gateway's reasons are kruntimes.wire.reasons').
TARGET_GONE = "TargetGone"
NOT_RUN = "NotRun"  # a Run's attempts ran out while none of them ran
OUTCOME_UNKNOWN = "OutcomeUnknown"  # an attempt that may have run, with no reason of the gateway's
GATEWAY_UNREACHABLE = "GatewayUnreachable"  # the attempt reached no gateway (httpStatus 0)
ASYNC_SHARE_FULL = GatewayReason.ASYNC_SHARE_FULL.value
RUN_NOT_READY = GatewayReason.RUN_NOT_READY.value
# The attempt's activity timed out before it recorded that it sends (its task never reached a
# worker's code): not run, and no fault of the target's.
ATTEMPT_NOT_STARTED = "AttemptNotStarted"
# Attempts whose activity never started, left uncounted for a Run (a server that loses every task
# would otherwise retry forever): past these, each counts toward retry.maxAttempts.
MAX_UNCOUNTED_NOT_STARTED = 10
ANSWER_STATUSES = frozenset({"Succeeded", "HandlerError", "InvalidOutput"})

Retried = Literal["", "notRun", "unknownOutcome", "failure"]


class AttemptKind(StrEnum):
    Succeeded = "Succeeded"  # 200, the function answered status Succeeded
    HandlerFailed = "HandlerFailed"  # 200, status HandlerError or InvalidOutput
    NotRun = "NotRun"  # proven not to have run (429, 503 before dispatch, no gateway reached)
    Unknown = "Unknown"  # may have run, its outcome lost (502, 504, 500, a gateway lost mid-call)
    TargetGone = "TargetGone"  # 404: the Run or Function is no more
    Rejected = "Rejected"  # refused as it is (400 and the like): another attempt gets the same answer


@dataclass(frozen=True)
class Next:
    """The invocation's next step: `state` Queued with `retry_in_s` (attempt again), or a terminal
    state with its `error` (None for Succeeded)."""

    state: InvocationState
    retried: Retried = ""
    retry_in_s: float = 0.0
    error: InvocationError | None = None

    @property
    def ends(self) -> bool:
        return self.state is not InvocationState.Queued


def answer_status(body: str) -> str:
    """The `status` of a 200 answer's JSON body ("" when it has none the contract knows)."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    status = parsed.get("status") if isinstance(parsed, dict) else None
    return status if isinstance(status, str) and status in ANSWER_STATUSES else ""


def answer_error(body: str) -> InvocationError:
    """A failed 200 answer's error: its `error.type` and `error.message`, else its status."""
    status = answer_status(body) or "HandlerError"
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict):
        message = error.get("message")
        kind = error.get("type")
        return InvocationError(
            reason=status,
            message=f"{kind}: {message}" if isinstance(kind, str) and isinstance(message, str) else status,
        )
    return InvocationError(reason=status, message="the handler failed")


def classify(outcome: AttemptOutcome) -> AttemptKind:
    status = outcome.httpStatus
    if status == 200:
        answered = answer_status(outcome.body)
        if answered == "Succeeded":
            return AttemptKind.Succeeded
        if answered:
            return AttemptKind.HandlerFailed
        return AttemptKind.Unknown  # a 200 outside the contract: it ran, what it answered is lost
    if not outcome.dispatched:
        if status == 404:
            return AttemptKind.TargetGone
        if status in (0, 429, 503):
            return AttemptKind.NotRun
        return AttemptKind.Rejected
    return AttemptKind.Unknown


def waits_its_turn(outcome: AttemptOutcome, not_started_before: int = 0) -> bool:
    """Refused by the target's async share (AsyncShareFull), or by a Run the gateway holds not
    Ready (RunNotReady: recovering, or draining before it ends, while its workflow still reads
    Ready), or its activity never started (AttemptNotStarted, the first
    MAX_UNCOUNTED_NOT_STARTED of them: `not_started_before` came before it): not run, and not
    counted for a Run, whose next read of the target decides."""
    if outcome.dispatched:
        return False
    if outcome.reason == ATTEMPT_NOT_STARTED and not_started_before >= MAX_UNCOUNTED_NOT_STARTED:
        return False
    return (outcome.httpStatus, outcome.reason) in (
        (429, ASYNC_SHARE_FULL),
        (503, RUN_NOT_READY),
        (0, ATTEMPT_NOT_STARTED),
    )


def callback_origin(url: str) -> str:
    """What the status shows of a callback URL: its scheme, host and port. Its path, query and
    userinfo are where a webhook's token rides, and the status goes to whoever may `get` the target."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port is not None else ""
    return f"{parts.scheme}://{host}{port}"


def backoff_seconds(attempts: int) -> float:
    """The wait after `attempts` attempts (1 s after the first, doubling, at most 60 s)."""
    if attempts <= 1:
        return FIRST_BACKOFF_S
    return min(FIRST_BACKOFF_S * 2.0 ** min(attempts - 1, 16), MAX_BACKOFF_S)


def _outcome_error(outcome: AttemptOutcome, *, fallback: str, message: str) -> InvocationError:
    return InvocationError(reason=outcome.reason or fallback, message=message)


def decide(
    outcome: AttemptOutcome,
    *,
    policy: InvocationPolicy,
    kind: TargetKind,
    attempts: int,
    ran: int,
    waited_turns: int = 0,
    not_started_before: int = 0,
) -> Next:
    """What follows attempt number `attempts` (`ran` of them were dispatched, `waited_turns` were
    not counted, waits_its_turn; this one included; `not_started_before` attempts before it never
    started).

    A Run's attempts are bounded by `retry.maxAttempts` whatever they came to, except those the
    target's async share refused (waiting its turn behind other async invocations is no failure
    to run: the backlog bounds those); a Function keeps an invocation that did not run while it
    exists, and bounds only the attempts that ran."""
    retry = policy.retry
    counted = attempts - waited_turns if kind is TargetKind.Run else ran
    more = counted < retry.maxAttempts
    wait = backoff_seconds(attempts)
    match classify(outcome):
        case AttemptKind.Succeeded:
            return Next(InvocationState.Succeeded)
        case AttemptKind.HandlerFailed:
            if retry.onFailure and more:
                return Next(InvocationState.Queued, retried="failure", retry_in_s=wait)
            return Next(InvocationState.Failed, error=answer_error(outcome.body))
        case AttemptKind.Unknown:
            if retry.onUnknownOutcome and more:
                return Next(InvocationState.Queued, retried="unknownOutcome", retry_in_s=wait)
            return Next(
                InvocationState.Unknown,
                error=_outcome_error(
                    outcome,
                    fallback=OUTCOME_UNKNOWN,
                    message=f"attempt {attempts} may have run and its outcome is lost; not retried"
                    + ("" if retry.onUnknownOutcome else " (retry.onUnknownOutcome is false)"),
                ),
            )
        case AttemptKind.NotRun:
            if kind is TargetKind.Function or more or waits_its_turn(outcome, not_started_before):
                return Next(InvocationState.Queued, retried="notRun", retry_in_s=wait)
            last = outcome.reason or (GATEWAY_UNREACHABLE if outcome.httpStatus == 0 else NOT_RUN)
            return Next(
                InvocationState.Failed,
                error=InvocationError(
                    reason=NOT_RUN,
                    message=f"not run in {attempts} attempts (retry.maxAttempts); the last: {last}",
                ),
            )
        case AttemptKind.TargetGone:
            return Next(InvocationState.Failed, error=target_gone(kind, outcome.reason or "not found"))
        case AttemptKind.Rejected:
            return Next(
                InvocationState.Failed,
                error=_outcome_error(
                    outcome, fallback=f"HTTP{outcome.httpStatus}", message="refused as it is; not retried"
                ),
            )


def target_gone(kind: TargetKind, why: str) -> InvocationError:
    """Failed TargetGone: the Run ended or was deleted, or the Function was deleted."""
    return InvocationError(reason=TARGET_GONE, message=f"the {kind.value} is gone: {why}")


def next_without_attempt(*, policy: InvocationPolicy, kind: TargetKind, waited: int) -> Next:
    """Before an attempt: a target that is gone fails the invocation; one that exists and is not
    Ready yet (a Run coming up or recovering) is waited for without an attempt, `waited` times
    already (the same backoff)."""
    if not policy.exists:
        return Next(InvocationState.Failed, error=target_gone(kind, policy.reason or "it no longer exists"))
    return Next(InvocationState.Queued, retried="notRun", retry_in_s=backoff_seconds(waited + 1))
