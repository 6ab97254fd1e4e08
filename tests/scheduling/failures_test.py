"""The provider failure catalogue and the structured failure result."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from kruntimes.decisions.scheduling.failures import (
    DEFAULT_RETRYABLE,
    FailureReason,
    ProviderError,
    ProviderFailure,
    ProviderOperation,
)


def test_every_failure_reason_has_a_default_retryability():
    assert set(DEFAULT_RETRYABLE) == set(FailureReason)


def test_failure_reasons_are_camel_case_strings_equal_to_their_names():
    for reason in FailureReason:
        assert reason.value == reason.name
        assert re.fullmatch(r"[A-Z][A-Za-z]+", reason.value)


@pytest.mark.parametrize(
    ("reason", "retryable"),
    [
        (FailureReason.ProviderNotFound, False),
        (FailureReason.CapabilityUnsupported, False),
        (FailureReason.OperationTimeout, True),
        (FailureReason.CircuitOpen, True),
        (FailureReason.OperationRejected, False),
        (FailureReason.UnexpectedError, False),
        (FailureReason.RetriesExhausted, False),
    ],
)
def test_a_failure_takes_the_catalogues_retryability_unless_told(reason, retryable):
    failure = ProviderFailure.of(reason, provider="process", operation=ProviderOperation.Create)
    assert failure.retryable is retryable
    flipped = ProviderFailure.of(reason, retryable=not retryable, provider="process", operation="Create")
    assert flipped.retryable is (not retryable)


def test_a_failure_names_provider_host_operation_reason_and_message():
    failure = ProviderFailure.of(
        FailureReason.EndpointInvalid,
        provider="attach",
        operation=ProviderOperation.Attach,
        host="h1",
        message="not a URL",
    )
    assert (failure.provider, failure.host, failure.operation, failure.reason, failure.retryable) == (
        "attach",
        "h1",
        ProviderOperation.Attach,
        FailureReason.EndpointInvalid,
        False,
    )
    assert failure.message == "not a URL"


def test_a_failure_with_an_unknown_reason_or_provider_name_is_refused():
    with pytest.raises(ValidationError, match="reason"):
        ProviderFailure(provider="process", operation="Create", reason="Oops", retryable=False)
    with pytest.raises(ValidationError, match="provider"):
        ProviderFailure(provider="Process", operation="Create", reason="HostLost", retryable=True)
    with pytest.raises(ValidationError, match="retryable"):
        ProviderFailure(provider="process", operation="Create", reason="HostLost", retryable="yes")


def test_a_provider_error_carries_its_failure_and_reason():
    failure = ProviderFailure.of(
        FailureReason.HostLost, provider="process", operation="AwaitReady", host="h1"
    )
    error = ProviderError(failure)
    assert error.failure is failure
    assert error.reason is FailureReason.HostLost
    assert error.retryable is True
    assert str(error).startswith("process AwaitReady: HostLost")
