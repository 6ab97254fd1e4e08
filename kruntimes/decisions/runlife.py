"""The timing decisions of a Run's lifecycle, as pure functions (RunWorkflow calls them).

- how long a Run waits before the next registration attempt (`registration_backoff`);
- when registration failures have spent the retry policy (`retries_exhausted`), and when moves
  to other hosts after host losses have spent the recovery limit (`recovery_exhausted`): two
  separate budgets, a host loss is not the function's fault;
- what a Ready function's idle timer concludes from the host's FunctionStatus (`idle_verdict`);
- what a failed Run's plain failure message says (`failure_summary`).

Nothing here reads a clock or does I/O: the workflow passes `workflow.now()` in, so the same
inputs give the same answer on every replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from kruntimes.api.spec import RetryPolicy
from kruntimes.contracts.hostcalls import FunctionState


def registration_backoff(policy: RetryPolicy, *, attempt: int) -> float:
    """Seconds to wait after failed registration `attempt` (1-based) before the next one:
    backoffSeconds × backoffMultiplier^(attempt − 1), never more than maxBackoffSeconds."""
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, not {attempt}")
    return min(
        policy.backoffSeconds * policy.backoffMultiplier ** (attempt - 1),
        policy.maxBackoffSeconds,
    )


def retries_exhausted(policy: RetryPolicy, *, failures: int) -> bool:
    """After `failures` failed registrations, no attempt is left (the policy's limit counts them
    all, the first attempt included)."""
    if failures < 0:
        raise ValueError(f"failures count from 0, not {failures}")
    return failures >= policy.limit


def recovery_exhausted(*, limit: int, recoveries: int) -> bool:
    """Whether the `recoveries`-th move to another host is one more than the Run's limit allows."""
    if limit < 0 or recoveries < 0:
        raise ValueError(f"the limit ({limit}) and recoveries ({recoveries}) count from 0")
    return recoveries > limit


def failure_summary(
    reason: str,
    *,
    cause: str = "",
    kind: str = "",
    host: str = "",
    attempt: int = 0,
    attempts_spent: bool = False,
) -> str:
    """A failed or timed-out Run's failure message as Temporal stores it unencrypted (the UI and
    `temporal workflow describe` show it): only the platform's own words, never a handler's text.

    `reason` is the Run's, `cause` the reason of the registration failure behind it (when another),
    `kind` the adapter's error class behind that failure (HandlerImportError, ProcessExited, ...),
    `host` the host id last assigned, `attempt` the last attempt; `attempts_spent`: the retry
    policy ran out after `attempt` attempts.
    """
    words = reason + (f": {cause}" if cause and cause != reason else "")
    if kind and kind not in (reason, cause):
        words += f" ({kind})"
    if host:
        words += f" on {host}"
    if attempt > 0:
        words += f" after {attempt} attempts" if attempts_spent and attempt > 1 else f" at attempt {attempt}"
    return words


@dataclass(frozen=True)
class IdleExpired:
    """No invocation ran and none is running for the whole idle timeout: the Run ends."""


@dataclass(frozen=True)
class IdleRearm:
    """Not idle long enough yet: look again at `at`."""

    at: datetime


@dataclass(frozen=True)
class RegistrationGone:
    """The host answers but no longer holds the registration (it was restarted or lost it)."""


IdleVerdict = IdleExpired | IdleRearm | RegistrationGone


def idle_verdict(*, idle_seconds: float, now: datetime, state: FunctionState) -> IdleVerdict:
    """What the idle timer, fired at `now`, concludes from the host's view of the function.

    The idle clock is the host's: `state.lastActivity` is when the last invocation ended. A
    function with an invocation running or waiting its turn, or whose host reports no last
    activity, is not idle:
    the timer is re-armed a whole idle timeout from now. Otherwise the function expires once
    lastActivity + idle has passed, and never earlier.
    """
    if idle_seconds <= 0:
        raise ValueError(f"the idle timeout is positive, not {idle_seconds}")
    if not state.registered:
        return RegistrationGone()
    if state.inFlight > 0 or state.waiting > 0 or state.lastActivity is None:
        return IdleRearm(now + timedelta(seconds=idle_seconds))
    due = state.lastActivity + timedelta(seconds=idle_seconds)
    if due <= now:
        return IdleExpired()
    return IdleRearm(due)
