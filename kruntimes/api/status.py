"""Run status: what the RunWorkflow's ``status`` query returns."""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Self

from pydantic import AfterValidator, AwareDatetime, Field, field_validator, model_validator

from kruntimes.api._base import ApiModel, StatusMessage, StrictInt
from kruntimes.api._text import has_control_chars, utf8_len
from kruntimes.api.limits import (
    MAX_CA_BUNDLE_BYTES,
    MAX_CONDITION_TOKEN_BYTES,
    MAX_CONDITIONS,
    MAX_ENDPOINT_URL_BYTES,
)
from kruntimes.api.outputs import validate_outputs
from kruntimes.api.phases import RunPhase

PEM_CERTIFICATE_MARKER = "-----BEGIN CERTIFICATE-----"
_CAMEL_CASE = re.compile(r"[A-Z][A-Za-z0-9]*")


class EndpointProtocol(StrEnum):
    HTTP = "HTTP"
    HTTPS = "HTTPS"


class Endpoint(ApiModel):
    """Where a Ready function Run is invoked. Readiness is the phase, never this field's presence."""

    protocol: EndpointProtocol
    url: str
    # PEM trust bundle when the gateway's certificate chains to the platform CA.
    caBundle: str | None = None

    @field_validator("caBundle")
    @classmethod
    def _ca_bundle_is_pem(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if utf8_len(value, field="endpoint.caBundle") > MAX_CA_BUNDLE_BYTES:
            raise ValueError(f"endpoint.caBundle exceeds {MAX_CA_BUNDLE_BYTES} bytes")
        if PEM_CERTIFICATE_MARKER not in value:
            raise ValueError(f"endpoint.caBundle must be PEM holding {PEM_CERTIFICATE_MARKER!r}")
        return value

    @model_validator(mode="after")
    def _url_matches_protocol(self) -> Self:
        if utf8_len(self.url, field="endpoint.url") > MAX_ENDPOINT_URL_BYTES:
            raise ValueError(f"endpoint.url exceeds {MAX_ENDPOINT_URL_BYTES} bytes")
        if has_control_chars(self.url) or any(c.isspace() for c in self.url):
            raise ValueError("endpoint.url must not contain whitespace or control characters")
        scheme = f"{self.protocol.value.lower()}://"
        if not self.url.lower().startswith(scheme) or len(self.url) == len(scheme):
            raise ValueError(f"endpoint.url must start with {scheme!r} for protocol {self.protocol.value}")
        return self


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionType(StrEnum):
    Ready = "Ready"


class ConditionReason(StrEnum):
    Scheduled = "Scheduled"
    Unschedulable = "Unschedulable"
    Registering = "Registering"
    FunctionRegistered = "FunctionRegistered"
    RegistrationFailed = "RegistrationFailed"
    RetriesExhausted = "RetriesExhausted"
    IdleTimeout = "IdleTimeout"
    Timeout = "Timeout"
    Cancelled = "Cancelled"
    Deleting = "Deleting"
    HostLost = "HostLost"
    HostDraining = "HostDraining"
    RegistrationLost = "RegistrationLost"
    Recovering = "Recovering"
    RecoveriesExhausted = "RecoveriesExhausted"
    TaskSucceeded = "TaskSucceeded"
    TaskFailed = "TaskFailed"


def _camel_case_token(value: str) -> str:
    if not 1 <= len(value) <= MAX_CONDITION_TOKEN_BYTES or not _CAMEL_CASE.fullmatch(value):
        raise ValueError(
            f"must be a CamelCase identifier [A-Z][A-Za-z0-9]* of at most "
            f"{MAX_CONDITION_TOKEN_BYTES} characters: {value!r:.80}"
        )
    return value


CamelCaseToken = Annotated[str, AfterValidator(_camel_case_token)]


class Condition(ApiModel):
    type: CamelCaseToken
    status: ConditionStatus
    reason: CamelCaseToken
    message: StatusMessage = ""
    lastTransitionTime: AwareDatetime

    @field_validator("status", mode="before")
    @classmethod
    def _yaml_bool_status(cls, value: object) -> object:
        # An unquoted YAML `status: True` arrives as a bool.
        if isinstance(value, bool):
            return ConditionStatus.TRUE if value else ConditionStatus.FALSE
        return value

    @classmethod
    def ready(cls, ready: bool, *, reason: str, message: str, at: datetime) -> Condition:
        """The Ready condition, True or False since ``at``."""
        return cls(
            type=ConditionType.Ready,
            status=ConditionStatus.TRUE if ready else ConditionStatus.FALSE,
            reason=reason,
            message=message,
            lastTransitionTime=at,
        )


class RunStatus(ApiModel):
    phase: RunPhase = RunPhase.Pending
    conditions: list[Condition] = Field(default_factory=list, max_length=MAX_CONDITIONS)
    # Registration lifecycle attempts (function) or executions (task), counting the first: the
    # registration epoch, one more with every new registration on a host.
    attempt: StrictInt = Field(default=0, ge=0)
    # Moves to another host after the Run's host was lost or drained (not registration failures:
    # those are what spec.retryPolicy counts).
    recoveries: StrictInt = Field(default=0, ge=0)
    assignedHost: str | None = Field(default=None, min_length=1)
    # Set and cleared together with assignedHost; disambiguates a reused host name.
    assignedHostUID: str | None = Field(default=None, min_length=1)
    endpoint: Endpoint | None = None
    startTime: AwareDatetime | None = None
    completionTime: AwareDatetime | None = None
    message: StatusMessage = ""
    # Task mode only.
    outputs: dict[str, object] | None = None

    @field_validator("conditions")
    @classmethod
    def _one_condition_per_type(cls, conditions: list[Condition]) -> list[Condition]:
        types = [c.type for c in conditions]
        if len(set(types)) != len(types):
            raise ValueError("status.conditions must hold at most one condition per type")
        return conditions

    @field_validator("outputs", mode="before")
    @classmethod
    def _outputs_are_bounded(cls, value: object) -> object:
        return None if value is None else validate_outputs(value)

    @model_validator(mode="after")
    def _host_and_uid_together(self) -> Self:
        if (self.assignedHost is None) != (self.assignedHostUID is None):
            raise ValueError("status.assignedHost and status.assignedHostUID are set and cleared together")
        return self

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    def with_condition(self, cond: Condition) -> RunStatus:
        """A copy with ``cond`` replacing the condition of its type (or appended).

        As in Kubernetes, lastTransitionTime is kept when the condition's status does not change.
        """
        old = self.condition(cond.type)
        if old is None:
            return self._replace(conditions=[*self.conditions, cond])
        if old.status == cond.status:
            cond = cond._replace(lastTransitionTime=old.lastTransitionTime)
        return self._replace(conditions=[cond if c.type == cond.type else c for c in self.conditions])
