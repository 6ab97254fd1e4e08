"""kruntimes.decisions.invocations: what each attempt of an async invocation leads to, row by row
of docs/async-invocations.md's table, and the backoff between attempts (#44)."""

from __future__ import annotations

import json

import pytest

from kruntimes.contracts.invocation import (
    AttemptOutcome,
    InvocationPolicy,
    InvocationState,
    Retry,
    TargetKind,
)
from kruntimes.decisions.invocations import (
    ATTEMPT_NOT_STARTED,
    MAX_UNCOUNTED_NOT_STARTED,
    NOT_RUN,
    TARGET_GONE,
    AttemptKind,
    answer_error,
    backoff_seconds,
    callback_origin,
    classify,
    decide,
    next_without_attempt,
    waits_its_turn,
)

RUN, FUNCTION = TargetKind.Run, TargetKind.Function
Q, S, F, U = (
    InvocationState.Queued,
    InvocationState.Succeeded,
    InvocationState.Failed,
    InvocationState.Unknown,
)


def answered(status: str, **extra: object) -> AttemptOutcome:
    body = json.dumps({"invocationId": "i", "status": status, "outputs": None, **extra})
    return AttemptOutcome(httpStatus=200, body=body, dispatched=True)


def refused(http: int, reason: str = "", *, dispatched: bool = False) -> AttemptOutcome:
    return AttemptOutcome(httpStatus=http, reason=reason, dispatched=dispatched)


def policy(**retry: object) -> InvocationPolicy:
    return InvocationPolicy(exists=True, ready=True, retry=Retry.model_validate(retry))


@pytest.mark.parametrize(
    ("outcome", "kind"),
    [
        (answered("Succeeded"), AttemptKind.Succeeded),
        (answered("HandlerError"), AttemptKind.HandlerFailed),
        (answered("InvalidOutput"), AttemptKind.HandlerFailed),
        (answered("Shrugged"), AttemptKind.Unknown),
        (AttemptOutcome(httpStatus=200, body="not json", dispatched=True), AttemptKind.Unknown),
        (AttemptOutcome(httpStatus=200, body="[1]", dispatched=True), AttemptKind.Unknown),
        (refused(429, "FunctionBusy"), AttemptKind.NotRun),
        (refused(429, "QueueTimeout"), AttemptKind.NotRun),
        (refused(429, "HostBusy"), AttemptKind.NotRun),
        (refused(429, "ReplicasFull"), AttemptKind.NotRun),
        (refused(429, "AsyncShareFull"), AttemptKind.NotRun),
        (refused(503, "RouteStale"), AttemptKind.NotRun),
        (refused(503, "OwnerUnavailable"), AttemptKind.NotRun),
        (refused(503, "NoReadyReplica"), AttemptKind.NotRun),
        (refused(503, "RunNotReady"), AttemptKind.NotRun),
        (refused(0), AttemptKind.NotRun),  # no gateway reached
        (refused(502, "OwnerUnreachable", dispatched=True), AttemptKind.Unknown),
        (refused(502, "FunctionProcessExited", dispatched=True), AttemptKind.Unknown),
        (refused(504, "InvocationTimeout", dispatched=True), AttemptKind.Unknown),
        (refused(500, "InternalError", dispatched=True), AttemptKind.Unknown),
        (refused(0, dispatched=True), AttemptKind.Unknown),  # the gateway lost mid-attempt
        (refused(503, "OwnerUnavailable", dispatched=True), AttemptKind.Unknown),  # dispatched wins
        (refused(404, "RunNotFound"), AttemptKind.TargetGone),
        (refused(404, "FunctionNotFound"), AttemptKind.TargetGone),
        (refused(400, "InvalidRequest"), AttemptKind.Rejected),
        (refused(400, "MalformedJSON"), AttemptKind.Rejected),
        (refused(413, "PayloadTooLarge"), AttemptKind.Rejected),
        (refused(403, "Forbidden"), AttemptKind.Rejected),
    ],
    ids=lambda v: (
        f"{v.httpStatus}-{v.reason or v.body[:30]}-{v.dispatched}" if isinstance(v, AttemptOutcome) else v
    ),
)
def test_each_answer_is_classified_as_the_table_says(outcome: AttemptOutcome, kind: AttemptKind) -> None:
    assert classify(outcome) is kind


def test_a_success_ends_succeeded_at_any_attempt() -> None:
    for attempts in (1, 5):
        assert decide(answered("Succeeded"), policy=policy(), kind=RUN, attempts=attempts, ran=1).state is S


def test_a_handler_error_fails_with_its_type_and_message_unless_on_failure() -> None:
    outcome = answered("HandlerError", error={"type": "ValueError", "message": "bad input"})
    ended = decide(outcome, policy=policy(), kind=RUN, attempts=1, ran=1)
    assert (ended.state, ended.error and ended.error.reason) == (F, "HandlerError")
    assert ended.error is not None and ended.error.message == "ValueError: bad input"
    retried = decide(outcome, policy=policy(onFailure=True, maxAttempts=3), kind=RUN, attempts=2, ran=2)
    assert (retried.state, retried.retried, retried.retry_in_s) == (Q, "failure", 2.0)
    last = decide(outcome, policy=policy(onFailure=True, maxAttempts=3), kind=RUN, attempts=3, ran=3)
    assert last.state is F


def test_an_answer_without_an_error_object_fails_with_its_status() -> None:
    assert answer_error(json.dumps({"status": "InvalidOutput"})).reason == "InvalidOutput"
    assert answer_error("not json").reason == "HandlerError"


def test_an_outcome_that_may_have_run_is_unknown_unless_declared_idempotent() -> None:
    lost = refused(502, "OwnerUnreachable", dispatched=True)
    ended = decide(lost, policy=policy(), kind=RUN, attempts=1, ran=1)
    assert ended.state is U and ended.error is not None
    assert ended.error.reason == "OwnerUnreachable" and "onUnknownOutcome is false" in ended.error.message
    assert decide(refused(0, dispatched=True), policy=policy(), kind=RUN, attempts=1, ran=1).error == (
        ended.error.model_copy(update={"reason": "OutcomeUnknown"})
    )
    idempotent = policy(onUnknownOutcome=True, maxAttempts=2)
    again = decide(lost, policy=idempotent, kind=FUNCTION, attempts=1, ran=1)
    assert (again.state, again.retried) == (Q, "unknownOutcome")
    assert decide(lost, policy=idempotent, kind=FUNCTION, attempts=2, ran=2).state is U


def test_a_run_retries_what_did_not_run_within_max_attempts_then_fails_not_run() -> None:
    busy = refused(429, "FunctionBusy")
    for attempts in range(1, 5):
        step = decide(busy, policy=policy(), kind=RUN, attempts=attempts, ran=0)
        assert (step.state, step.retried, step.retry_in_s) == (Q, "notRun", backoff_seconds(attempts))
    ended = decide(busy, policy=policy(), kind=RUN, attempts=5, ran=0)
    assert ended.state is F and ended.error is not None and ended.error.reason == NOT_RUN
    assert "not run in 5 attempts" in ended.error.message and "FunctionBusy" in ended.error.message
    unreachable = decide(refused(0), policy=policy(maxAttempts=1), kind=RUN, attempts=1, ran=0)
    assert unreachable.error is not None and "GatewayUnreachable" in unreachable.error.message


def test_a_function_keeps_what_did_not_run_past_max_attempts() -> None:
    step = decide(
        refused(503, "NoReadyReplica"), policy=policy(maxAttempts=1), kind=FUNCTION, attempts=500, ran=0
    )
    assert (step.state, step.retried, step.retry_in_s) == (Q, "notRun", 60.0)


def test_a_functions_bound_counts_only_the_attempts_that_ran() -> None:
    failed = answered("HandlerError")
    retrying = policy(onFailure=True, maxAttempts=2)
    assert decide(failed, policy=retrying, kind=FUNCTION, attempts=30, ran=1).state is Q
    assert decide(failed, policy=retrying, kind=FUNCTION, attempts=31, ran=2).state is F
    assert decide(failed, policy=retrying, kind=RUN, attempts=2, ran=1).state is F


@pytest.mark.parametrize("kind", [RUN, FUNCTION])
def test_not_found_fails_target_gone_and_a_refusal_fails_as_it_is(kind: TargetKind) -> None:
    gone = decide(refused(404, "RunNotFound"), policy=policy(maxAttempts=100), kind=kind, attempts=1, ran=0)
    assert gone.state is F and gone.error is not None and gone.error.reason == TARGET_GONE
    assert f"the {kind.value} is gone: RunNotFound" == gone.error.message
    bad = decide(refused(400, "MalformedJSON"), policy=policy(maxAttempts=100), kind=kind, attempts=1, ran=0)
    assert bad.state is F and bad.error is not None and bad.error.reason == "MalformedJSON"
    odd = decide(refused(418), policy=policy(maxAttempts=100), kind=kind, attempts=1, ran=0)
    assert odd.error is not None and odd.error.reason == "HTTP418"


def test_the_backoff_doubles_from_one_second_to_sixty() -> None:
    assert [backoff_seconds(n) for n in range(9)] == [1, 1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff_seconds(10_000) == 60


def test_a_gone_target_fails_before_an_attempt_and_one_not_ready_is_waited_for() -> None:
    gone = next_without_attempt(
        policy=InvocationPolicy(exists=False, reason="the Run ended Succeeded"), kind=RUN, waited=0
    )
    assert gone.state is F and gone.error is not None
    assert (gone.error.reason, gone.error.message) == (
        TARGET_GONE,
        "the Run is gone: the Run ended Succeeded",
    )
    waiting = next_without_attempt(policy=InvocationPolicy(exists=True, ready=False), kind=RUN, waited=3)
    assert (waiting.state, waiting.retry_in_s, waiting.ends) == (Q, 8.0, False)
    assert gone.ends


def test_a_run_waiting_its_turn_for_the_async_share_is_not_counted() -> None:
    share_full = refused(429, "AsyncShareFull")
    bounded = policy(maxAttempts=2)
    step = decide(share_full, policy=bounded, kind=RUN, attempts=40, ran=0, waited_turns=40)
    assert (step.state, step.retried, step.retry_in_s) == (Q, "notRun", 60.0)
    busy = refused(429, "FunctionBusy")
    assert decide(busy, policy=bounded, kind=RUN, attempts=41, ran=0, waited_turns=40).state is Q
    assert decide(busy, policy=bounded, kind=RUN, attempts=42, ran=0, waited_turns=40).state is F
    dispatched = refused(429, "AsyncShareFull", dispatched=True)  # outside the contract: may have run
    assert decide(dispatched, policy=bounded, kind=RUN, attempts=1, ran=1).state is U


def test_a_run_the_gateway_holds_not_ready_is_waited_for_without_counting() -> None:
    """A draining Run still reads Ready to its workflow while the gateway answers RunNotReady: its
    invocations must not run out of attempts (NotRun) before the Run ends (TargetGone)."""
    not_ready = refused(503, "RunNotReady")
    assert waits_its_turn(not_ready) and not waits_its_turn(refused(503, "OwnerUnavailable"))
    step = decide(not_ready, policy=policy(maxAttempts=1), kind=RUN, attempts=9, ran=0, waited_turns=9)
    assert (step.state, step.retried) == (Q, "notRun")


def test_an_attempt_whose_activity_never_started_is_retried_without_counting() -> None:
    """Its task was lost before any code of ours ran (the workflow read no ATTEMPT_SENT): nothing
    ran, and no fault of the target's."""
    lost = refused(0, ATTEMPT_NOT_STARTED)
    assert classify(lost) is AttemptKind.NotRun and waits_its_turn(lost)
    assert not waits_its_turn(refused(0, ATTEMPT_NOT_STARTED, dispatched=True))
    step = decide(lost, policy=policy(maxAttempts=1), kind=RUN, attempts=3, ran=0, waited_turns=3)
    assert (step.state, step.retried) == (Q, "notRun")


def test_attempts_whose_activity_never_started_count_once_past_a_bound() -> None:
    """A server that loses every task must not keep a Run's invocation retrying forever: past
    MAX_UNCOUNTED_NOT_STARTED such attempts, each counts, and retry.maxAttempts ends it NotRun."""
    lost = refused(0, ATTEMPT_NOT_STARTED)
    bound = MAX_UNCOUNTED_NOT_STARTED
    assert waits_its_turn(lost, bound - 1) and not waits_its_turn(lost, bound)
    assert waits_its_turn(refused(503, "RunNotReady"), bound), "only the never-started ones are bounded"
    turns = sum(waits_its_turn(lost, n) for n in range(bound + 3))
    step = decide(
        lost,
        policy=policy(maxAttempts=3),
        kind=RUN,
        attempts=bound + 3,
        ran=0,
        waited_turns=turns,
        not_started_before=bound + 2,
    )
    assert step.state is F and step.error is not None and "not run in" in step.error.message


def test_the_status_shows_a_callbacks_origin_only() -> None:
    assert (
        callback_origin("https://u:pw@hooks.example:8443/t/SECRET?k=SECRET#f") == "https://hooks.example:8443"
    )
    assert callback_origin("https://hooks.example/x") == "https://hooks.example"
    assert callback_origin("https://[::1]:9/x?y") == "https://[::1]:9"
