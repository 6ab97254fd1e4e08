"""kruntimes.decisions.runlife: the registration backoff and the idle timer's verdict."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kruntimes.api.limits import MAX_BACKOFF_MULTIPLIER, MAX_BACKOFF_SECONDS, MAX_RETRY_LIMIT
from kruntimes.api.spec import RetryPolicy
from kruntimes.contracts.hostcalls import FunctionState
from kruntimes.decisions.runlife import (
    IdleExpired,
    IdleRearm,
    RegistrationGone,
    failure_summary,
    idle_verdict,
    recovery_exhausted,
    registration_backoff,
    retries_exhausted,
)

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
IDLE = 60

# --- the registration backoff ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "seconds"),
    [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 16.0), (6, 32.0), (7, 60.0), (8, 60.0), (30, 60.0)],
)
def test_the_default_policy_doubles_from_one_second_up_to_a_minute(attempt: int, seconds: float) -> None:
    assert registration_backoff(RetryPolicy(), attempt=attempt) == seconds


def test_a_multiplier_of_one_waits_the_same_each_time() -> None:
    policy = RetryPolicy(backoffSeconds=0.5, backoffMultiplier=1.0, maxBackoffSeconds=10.0)
    assert [registration_backoff(policy, attempt=a) for a in (1, 2, 10)] == [0.5, 0.5, 0.5]


def test_a_zero_backoff_retries_at_once() -> None:
    policy = RetryPolicy(backoffSeconds=0.0, maxBackoffSeconds=0.0)
    assert registration_backoff(policy, attempt=5) == 0.0


def test_the_cap_applies_from_the_first_attempt_it_is_reached() -> None:
    policy = RetryPolicy(backoffSeconds=0.1, backoffMultiplier=3.0, maxBackoffSeconds=0.5)
    assert [registration_backoff(policy, attempt=a) for a in (1, 2, 3)] == pytest.approx([0.1, 0.3, 0.5])


def test_the_arithmetic_is_the_one_recorded_histories_were_made_with() -> None:
    """Replays depend on the exact float: backoff × multiplier^(attempt − 1), then the cap."""
    policy = RetryPolicy(backoffSeconds=0.1, backoffMultiplier=2.0, maxBackoffSeconds=0.2)
    assert registration_backoff(policy, attempt=1) == 0.1 * 2.0**0
    assert registration_backoff(policy, attempt=2) == min(0.1 * 2.0**1, 0.2)


@pytest.mark.parametrize("attempt", [0, -1])
def test_attempts_count_from_one(attempt: int) -> None:
    with pytest.raises(ValueError, match="attempt counts from 1"):
        registration_backoff(RetryPolicy(), attempt=attempt)


policies = st.builds(
    lambda base, multiplier, extra: RetryPolicy(
        backoffSeconds=base,
        backoffMultiplier=multiplier,
        maxBackoffSeconds=min(base + extra, MAX_BACKOFF_SECONDS),
    ),
    st.floats(min_value=0, max_value=MAX_BACKOFF_SECONDS),
    st.floats(min_value=1, max_value=MAX_BACKOFF_MULTIPLIER),
    st.floats(min_value=0, max_value=MAX_BACKOFF_SECONDS),
)
attempts = st.integers(min_value=1, max_value=MAX_RETRY_LIMIT)


@given(policy=policies, attempt=attempts)
def test_the_backoff_is_capped_and_never_below_the_first(policy: RetryPolicy, attempt: int) -> None:
    backoff = registration_backoff(policy, attempt=attempt)
    assert policy.backoffSeconds <= backoff <= policy.maxBackoffSeconds


@given(policy=policies, attempt=attempts)
def test_the_backoff_never_shrinks_from_one_attempt_to_the_next(policy: RetryPolicy, attempt: int) -> None:
    assert registration_backoff(policy, attempt=attempt) <= registration_backoff(policy, attempt=attempt + 1)


# --- the idle timer's verdict ---------------------------------------------------------------------


def _state(
    *, registered: bool = True, in_flight: int = 0, waiting: int = 0, last: datetime | None = NOW
) -> FunctionState:
    return FunctionState(
        registered=registered, ready=registered, inFlight=in_flight, waiting=waiting, lastActivity=last
    )


def test_a_function_idle_for_the_whole_timeout_expires() -> None:
    state = _state(last=NOW - timedelta(seconds=IDLE))
    assert idle_verdict(idle_seconds=IDLE, now=NOW, state=state) == IdleExpired()


def test_a_function_idle_for_longer_expires() -> None:
    state = _state(last=NOW - timedelta(hours=5))
    assert idle_verdict(idle_seconds=IDLE, now=NOW, state=state) == IdleExpired()


def test_an_invocation_since_the_timer_was_armed_moves_expiry_to_a_timeout_after_it() -> None:
    last = NOW - timedelta(seconds=10)
    verdict = idle_verdict(idle_seconds=IDLE, now=NOW, state=_state(last=last))
    assert verdict == IdleRearm(last + timedelta(seconds=IDLE))


def test_one_microsecond_short_of_the_timeout_is_not_idle() -> None:
    last = NOW - timedelta(seconds=IDLE) + timedelta(microseconds=1)
    assert idle_verdict(idle_seconds=IDLE, now=NOW, state=_state(last=last)) == IdleRearm(
        NOW + timedelta(microseconds=1)
    )


def test_an_invocation_in_flight_is_never_idle_and_rearms_a_whole_timeout_from_now() -> None:
    state = _state(in_flight=1, last=NOW - timedelta(hours=5))
    assert idle_verdict(idle_seconds=IDLE, now=NOW, state=state) == IdleRearm(NOW + timedelta(seconds=IDLE))


def test_an_invocation_waiting_its_turn_is_never_idle_either() -> None:
    state = _state(waiting=2, last=NOW - timedelta(hours=5))
    assert idle_verdict(idle_seconds=IDLE, now=NOW, state=state) == IdleRearm(NOW + timedelta(seconds=IDLE))


def test_a_single_invocation_waiting_its_turn_is_enough_to_keep_a_function() -> None:
    state = _state(waiting=1, last=NOW - timedelta(hours=5))
    assert idle_verdict(idle_seconds=IDLE, now=NOW, state=state) == IdleRearm(NOW + timedelta(seconds=IDLE))


def test_no_last_activity_rearms_a_whole_timeout_from_now() -> None:
    state = _state(last=None)
    assert idle_verdict(idle_seconds=IDLE, now=NOW, state=state) == IdleRearm(NOW + timedelta(seconds=IDLE))


@pytest.mark.parametrize("in_flight", [0, 3])
@pytest.mark.parametrize("last", [None, NOW, NOW - timedelta(hours=1)])
def test_a_registration_the_host_no_longer_holds_is_gone_whatever_else_it_says(
    in_flight: int, last: datetime | None
) -> None:
    state = _state(registered=False, in_flight=in_flight, last=last)
    assert idle_verdict(idle_seconds=IDLE, now=NOW, state=state) == RegistrationGone()


@pytest.mark.parametrize("idle", [0, -1])
def test_the_idle_timeout_is_positive(idle: int) -> None:
    with pytest.raises(ValueError, match="idle timeout is positive"):
        idle_verdict(idle_seconds=idle, now=NOW, state=_state())


offsets = st.integers(min_value=-(10**6), max_value=10**6).map(lambda us: timedelta(milliseconds=us))


@given(
    idle=st.integers(min_value=1, max_value=7 * 24 * 3600),
    last_offset=st.one_of(st.none(), offsets),
    in_flight=st.integers(min_value=0, max_value=3),
)
def test_expiry_is_never_earlier_than_a_whole_timeout_after_the_last_activity(
    idle: int, last_offset: timedelta | None, in_flight: int
) -> None:
    last = None if last_offset is None else NOW + last_offset
    verdict = idle_verdict(idle_seconds=idle, now=NOW, state=_state(in_flight=in_flight, last=last))
    if isinstance(verdict, IdleExpired):
        assert last is not None and in_flight == 0
        assert last + timedelta(seconds=idle) <= NOW
    else:
        assert isinstance(verdict, IdleRearm)
        assert verdict.at > NOW, "the timer is always re-armed in the future"
        if last is not None and in_flight == 0:  # the next look is exactly when it may expire
            assert verdict.at == last + timedelta(seconds=idle)


# --- the failed Run's plain failure message -----------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "cause", "kind", "host", "attempt", "spent", "said"),
    [
        (
            "RetriesExhausted",
            "HandlerLoadInterrupted",
            "ProcessExited",
            "python-0",
            3,
            True,
            "RetriesExhausted: HandlerLoadInterrupted (ProcessExited) on python-0 after 3 attempts",
        ),
        (
            "RetriesExhausted",
            "HostUnavailable",
            "",
            "python-1",
            1,
            True,
            "RetriesExhausted: HostUnavailable on python-1 at attempt 1",
        ),
        (
            "HandlerLoadFailed",
            "HandlerLoadFailed",
            "HandlerImportError",
            "python-0",
            1,
            False,
            "HandlerLoadFailed (HandlerImportError) on python-0 at attempt 1",
        ),
        (
            "TaskFailed",
            "HandlerError",
            "HandlerError",
            "python-0",
            1,
            False,
            "TaskFailed: HandlerError on python-0 at attempt 1",
        ),
        ("IdleTimeout", "", "", "bash-2", 2, False, "IdleTimeout on bash-2 at attempt 2"),
        ("RuntimeUnknown", "", "", "", 0, False, "RuntimeUnknown"),
    ],
)
def test_a_failed_runs_plain_message_is_its_reason_cause_adapter_class_host_and_attempt(
    reason: str, cause: str, kind: str, host: str, attempt: int, spent: bool, said: str
) -> None:
    assert (
        failure_summary(reason, cause=cause, kind=kind, host=host, attempt=attempt, attempts_spent=spent)
        == said
    )


def test_a_reason_alone_is_the_whole_message() -> None:
    assert failure_summary("RuntimeUnknown") == "RuntimeUnknown"


def test_an_attempt_without_the_policy_spent_says_at_which_attempt() -> None:
    assert failure_summary("IdleTimeout", attempt=3) == "IdleTimeout at attempt 3"


def test_a_policy_spent_after_two_attempts_says_so() -> None:
    assert (
        failure_summary("RetriesExhausted", attempt=2, attempts_spent=True)
        == "RetriesExhausted after 2 attempts"
    )


# --- the two budgets: registration retries and recoveries after host losses ---------------------


@pytest.mark.parametrize(("failures", "spent"), [(0, False), (2, False), (3, True), (4, True)])
def test_the_retry_limit_counts_every_failed_attempt_the_first_included(failures: int, spent: bool) -> None:
    assert retries_exhausted(RetryPolicy(limit=3), failures=failures) is spent


def test_failures_count_from_zero() -> None:
    assert retries_exhausted(RetryPolicy(limit=1), failures=0) is False
    with pytest.raises(ValueError, match="failures count from 0, not -1"):
        retries_exhausted(RetryPolicy(), failures=-1)


@pytest.mark.parametrize(("recoveries", "spent"), [(0, False), (2, False), (3, True)])
def test_the_recovery_limit_allows_that_many_moves_and_not_one_more(recoveries: int, spent: bool) -> None:
    assert recovery_exhausted(limit=2, recoveries=recoveries) is spent


def test_a_recovery_limit_of_zero_allows_no_move() -> None:
    assert recovery_exhausted(limit=0, recoveries=0) is False
    assert recovery_exhausted(limit=0, recoveries=1) is True


@pytest.mark.parametrize(("limit", "recoveries"), [(-1, 0), (0, -1)])
def test_the_recovery_limit_and_count_are_never_negative(limit: int, recoveries: int) -> None:
    with pytest.raises(
        ValueError, match=rf"the limit \({limit}\) and recoveries \({recoveries}\) count from 0"
    ):
        recovery_exhausted(limit=limit, recoveries=recoveries)
