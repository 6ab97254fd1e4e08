"""Structured results of host-provider operations: every failed operation reports which provider,
host and operation, a reason from one catalogue, whether a retry may help, and a message.

Reasons are transport-neutral CamelCase strings (a provider speaking HTTP, gRPC or the Kubernetes
API maps its own failures onto them): the same string is the ApplicationError type, the metrics
label and the text a caller sees. Errors::

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
    # A provider name is stable and lowercase (a DNS-1123 label): it is a metrics label and a key.
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
    Fence = "Fence"  # make a lost host unable to serve, and prove it


class FailureReason(StrEnum):
    """The reason catalogue: each line says when a provider reports it."""

    ProviderNotFound = "ProviderNotFound"  # no provider of that name is configured
    CapabilityUnsupported = "CapabilityUnsupported"  # the provider cannot do what was asked
    EndpointMissing = "EndpointMissing"  # the operation needs an endpoint and none was given
    EndpointInvalid = "EndpointInvalid"  # the endpoint given is malformed
    ProviderUnavailable = "ProviderUnavailable"  # the provider's backend cannot be reached
    OperationTimeout = "OperationTimeout"  # no answer within the operation's time limit
    OperationFailed = "OperationFailed"  # the operation failed in a way another try may fix
    OperationRejected = "OperationRejected"  # the backend refused the request as it is
    InvalidResponse = "InvalidResponse"  # the backend answered something that makes no sense
    CircuitOpen = "CircuitOpen"  # recent failures keep calls from the backend for a while
    OperationCancelled = "OperationCancelled"  # the operation was cancelled before it finished
    UnexpectedError = "UnexpectedError"  # an error no other reason describes (a bug, until known)
    RetriesExhausted = "RetriesExhausted"  # every retry failed; the last failure is in the message
    ReadinessTimeout = "ReadinessTimeout"  # the host started but never served within the limit
    HostLost = "HostLost"  # the host process died or stopped heartbeating mid-operation
    ImagePullFailed = "ImagePullFailed"  # the host's image cannot be pulled (the pull backoff shows it)
    Unschedulable = "Unschedulable"  # no node can take the host now (the scheduler's message says why)
    HostCrashed = "HostCrashed"  # the host's process exited while starting (its last state says how)
    QuotaExceeded = "QuotaExceeded"  # a quota of the backend refuses another host for now
    AdmissionDenied = "AdmissionDenied"  # an admission policy refuses the host as it is built
    Forbidden = "Forbidden"  # the control plane's credentials may not do this
    ApiUnavailable = "ApiUnavailable"  # the backend's API cannot be reached or is overloaded


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
        FailureReason.ImagePullFailed: False,  # pulled again, the same image fails again
        FailureReason.Unschedulable: True,  # capacity appears (autoscaling, pods ending)
        FailureReason.HostCrashed: True,  # bounded by the caller's retry policy
        FailureReason.QuotaExceeded: True,  # quota frees up as other pods end
        FailureReason.AdmissionDenied: False,  # the same object is refused again
        FailureReason.Forbidden: False,  # permissions change only by an operator
        FailureReason.ApiUnavailable: True,
    }
)


class ProviderFailure(ApiModel):
    """One failed provider operation: provider, host, operation, reason, retryable, message.

    ``tenant`` and ``requestId`` (the scale-out's id, to correlate) are set when known.
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
