"""Structured results of host-provider operations (seed 003, "Provider operations should return
structured results", lines 1260-1269; HTTP failure reasons, lines 886-896).

The seed's transport-specific reasons (``http-dispatch-timeout`` ...) become transport-neutral,
CamelCase reason strings: the same string is the ApplicationError type, the metrics label and the
text a caller sees. Errors::

    Exception
     └── ProviderError   a provider operation failed; .failure is the ProviderFailure
"""

from __future__ import annotations

from enum import StrEnum
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from kruntimes.api._base import ApiModel, StatusMessage, StrictBool
from kruntimes.api.names import validate_dns1123_label


def _provider_name(value: str) -> str:
    # Seed line 366: "The provider name should be stable and lowercase."
    return validate_dns1123_label(value, field="provider")


ProviderName = Annotated[str, AfterValidator(_provider_name)]


class ProviderOperation(StrEnum):
    """What the host manager was asked to do."""

    Select = "Select"  # resolve a provider by name and capability
    Create = "Create"  # start a new host
    Attach = "Attach"  # adopt an existing endpoint
    AwaitReady = "AwaitReady"  # wait until the host serves and is registered
    Status = "Status"
    Delete = "Delete"


class FailureReason(StrEnum):
    """The reason catalogue. Each line names the seed reason or rule it stands for."""

    ProviderNotFound = "ProviderNotFound"  # "structured failure when provider is missing" (526)
    CapabilityUnsupported = "CapabilityUnsupported"  # capability check (525); "no scaler registered" (777)
    EndpointMissing = "EndpointMissing"  # http-endpoint-missing
    EndpointInvalid = "EndpointInvalid"  # http-endpoint-invalid
    ProviderUnavailable = "ProviderUnavailable"  # http-provider-unavailable
    OperationTimeout = "OperationTimeout"  # http-dispatch-timeout
    OperationFailed = "OperationFailed"  # http-command-failed
    OperationRejected = "OperationRejected"  # http-command-non-retryable
    InvalidResponse = "InvalidResponse"  # http-command-invalid-response
    CircuitOpen = "CircuitOpen"  # http-circuit-open
    OperationCancelled = "OperationCancelled"  # http-command-cancelled
    UnexpectedError = "UnexpectedError"  # http-command-exception
    RetriesExhausted = "RetriesExhausted"  # "retry exhaustion classification" (879)
    ReadinessTimeout = "ReadinessTimeout"  # "readiness confirms usable capacity" never happened (658)
    HostLost = "HostLost"  # the host process died or stopped heartbeating mid-operation (1058)


# Whether a failure is worth retrying when the provider does not say. Unknown errors are not:
# a bug retried forever looks like an outage.
DEFAULT_RETRYABLE: MappingProxyType[FailureReason, bool] = MappingProxyType(
    {
        FailureReason.ProviderNotFound: False,
        FailureReason.CapabilityUnsupported: False,
        FailureReason.EndpointMissing: False,
        FailureReason.EndpointInvalid: False,
        FailureReason.ProviderUnavailable: True,
        FailureReason.OperationTimeout: True,
        FailureReason.OperationFailed: True,
        FailureReason.OperationRejected: False,
        FailureReason.InvalidResponse: False,
        FailureReason.CircuitOpen: True,
        FailureReason.OperationCancelled: False,
        FailureReason.UnexpectedError: False,
        FailureReason.RetriesExhausted: False,
        FailureReason.ReadinessTimeout: True,
        FailureReason.HostLost: True,
    }
)


class ProviderFailure(ApiModel):
    """One failed provider operation: provider, host, operation, reason, retryable, message.

    ``tenant`` and ``requestId`` are the seed's "tenant id / correlation id when available".
    """

    provider: ProviderName
    operation: ProviderOperation
    reason: FailureReason
    retryable: StrictBool
    message: StatusMessage = ""
    host: str | None = Field(default=None, min_length=1)
    tenant: str | None = Field(default=None, min_length=1)
    requestId: str | None = Field(default=None, min_length=1)

    @classmethod
    def of(cls, reason: FailureReason, *, retryable: bool | None = None, **fields: Any) -> ProviderFailure:
        """A failure whose ``retryable`` defaults to the catalogue's answer for ``reason``."""
        if retryable is None:
            retryable = DEFAULT_RETRYABLE[reason]
        return cls.model_validate({**fields, "reason": reason, "retryable": retryable})


class ProviderError(Exception):
    """Raised at the host-manager boundary; the structured failure travels with it."""

    def __init__(self, failure: ProviderFailure) -> None:
        super().__init__(f"{failure.provider} {failure.operation}: {failure.reason}: {failure.message}")
        self.failure = failure

    @property
    def reason(self) -> FailureReason:
        return self.failure.reason

    @property
    def retryable(self) -> bool:
        return self.failure.retryable
