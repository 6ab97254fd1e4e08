"""Scheduling state and decisions: hosts, reservations, admission requests, scale-out requests.

Everything here is pure data that travels through Temporal (pool state, signals, continue-as-new
input), so it is pydantic ``ApiModel``: frozen, camelCase, round-trips through the pydantic data
converter.

Tenancy: a host is Shared (the shared pool, no owner), Dedicated or Hybrid (owned by a tenant or a
tenant group). A tenant's ``TenantPolicy`` says which of those it may see; the rules are
``kruntimes.decisions.scheduling.admission.is_visible``.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Annotated, Literal, Self

from pydantic import AfterValidator, AwareDatetime, Field, model_validator

from kruntimes.api._base import ApiModel, StatusMessage, StrictBool, StrictFloat, StrictInt
from kruntimes.api.ids import HostId, HostUid, RuntimeName, RunUid
from kruntimes.api.names import validate_dns1123_label
from kruntimes.decisions.scheduling.failures import ProviderFailure, ProviderName


def _label(field: str) -> AfterValidator:
    return AfterValidator(lambda value: validate_dns1123_label(value, field=field))


# Opaque identities (host ids, host UIDs, run UIDs, request ids): non-empty, bounded.
Identity = Annotated[str, Field(min_length=1, max_length=253)]
HostIdField = Annotated[HostId, Field(min_length=1, max_length=253)]
HostUidField = Annotated[HostUid, Field(min_length=1, max_length=253)]
RunUidField = Annotated[RunUid, Field(min_length=1, max_length=253)]
TenantName = Annotated[str, _label("tenant")]
GroupName = Annotated[str, _label("tenantGroup")]
RuntimeField = Annotated[RuntimeName, _label("runtime")]


class HostState(StrEnum):
    """Host lifecycle.

    Unassigned ─▶ Assigned ─▶ Ready ─▶ Draining ─▶ Terminating;  any ─▶ Lost
    """

    Unassigned = "Unassigned"  # exists, not yet given its runtime/tenant scope
    Assigned = "Assigned"  # scope given, registration in progress; deleted after 2x assignment timeout
    Ready = "Ready"  # serving and registered: the only state that accepts new runs
    Draining = "Draining"  # takes no new runs; its runs finish
    Terminating = "Terminating"  # being deleted
    Lost = "Lost"  # stopped heartbeating or exited; its runs recover (fenced) elsewhere


# Hosts that may still turn into usable capacity without a new scale-out.
PROVISIONING_STATES: frozenset[HostState] = frozenset({HostState.Unassigned, HostState.Assigned})
# Hosts that occupy a place under maxHosts: everything that still exists.
COUNTED_STATES: frozenset[HostState] = frozenset(HostState) - {HostState.Lost}


class TenancyMode(StrEnum):
    Shared = "Shared"
    Dedicated = "Dedicated"
    Hybrid = "Hybrid"


# The label naming the provider that made a host (process, attach, kubernetes): the pool, the
# prober and the reconciler find a host's provider by it.
PROVIDER_LABEL = "kruntimes.io/provider"


class Host(ApiModel):
    """One runtime host of a pool, with its capacity (``runs`` slots) and tenant scope."""

    hostId: HostIdField
    # Disambiguates a re-created host that reuses its id; reservations name both.
    hostUid: HostUidField
    runtime: RuntimeField
    # host:port of the Runtime Server; known once the provider has started it.
    address: str | None = Field(default=None, min_length=1)
    state: HostState = HostState.Unassigned
    capacity: StrictInt = Field(ge=1)
    # Owner. None on a Shared host; a Dedicated/Hybrid host is owned by a tenant, a group, or both.
    tenant: TenantName | None = None
    tenantGroup: GroupName | None = None
    tenancy: TenancyMode = TenancyMode.Shared
    labels: dict[str, str] = Field(default_factory=dict)
    createdAt: AwareDatetime
    assignedAt: AwareDatetime | None = None
    readyAt: AwareDatetime | None = None
    # A HostWorkflow (host/{runtime}/{hostId}) watches it: scale-in, drain and delete go through it.
    supervised: StrictBool = False
    # A one-shot runtime's host that took its one Run: it takes no other and is deleted once free.
    spent: StrictBool = False

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.tenancy is TenancyMode.Shared and (self.tenant is not None or self.tenantGroup is not None):
            raise ValueError("tenant: a Shared host belongs to the shared pool and has no tenant owner")
        if self.state is HostState.Ready:
            missing = [f for f in ("address", "assignedAt", "readyAt") if getattr(self, f) is None]
            if missing:
                raise ValueError(f"state: a Ready host needs {', '.join(missing)}")
        if self.state is HostState.Assigned and self.assignedAt is None:
            raise ValueError("assignedAt: an Assigned host needs assignedAt")
        return self


class Reservation(ApiModel):
    """One run slot taken by one Run: admission picks the host, then the slot is reserved."""

    runUid: RunUidField
    hostId: HostIdField
    hostUid: HostUidField
    tenant: TenantName | None = None
    reservedAt: AwareDatetime


class TenantPolicy(ApiModel):
    """A tenant's runtime settings that admission and scale-out honour."""

    mode: TenancyMode = TenancyMode.Shared
    # Hybrid only: may this tenant use Shared hosts when its own are full?
    allowSharedFallback: StrictBool = False
    # Own hosts are tried before shared ones (ordering only; visibility is unchanged).
    preferDedicatedCapacity: StrictBool = True
    # Hosts owned by this group are the tenant's own too (a host matches by tenant or by group).
    group: Annotated[str, _label("group")] | None = None
    # Hosts this tenant's scope may hold at most; None: only the runtime's maxHosts.
    maxHosts: StrictInt | None = Field(default=None, ge=0)
    # This tenant's Runs one host takes at most at once, whoever owns it; None: the host's slots.
    maxRunsPerHost: StrictInt | None = Field(default=None, ge=1)
    # This tenant's Runs one runtime's queue holds at most; None: only the runtime's queueLimit.
    queueLimit: StrictInt | None = Field(default=None, ge=0)
    # The part of a runtime's queue (its queueLimit) this tenant's Runs may fill, and its weight
    # when queued Runs are placed (turns in proportion to it); None: 1, all of it.
    queueShare: StrictFloat | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)

    @model_validator(mode="after")
    def _dedicated_never_falls_back(self) -> Self:
        # Shared hosts are visible to a tenant whose settings allow shared fallback, and a
        # Dedicated tenant never lands on shared capacity: forbidding the combination keeps both.
        if self.mode is TenancyMode.Dedicated and self.allowSharedFallback:
            raise ValueError("allowSharedFallback: a Dedicated tenant never falls back to shared capacity")
        return self

    @property
    def weight(self) -> float:
        """Its turns, relative to other tenants', when a runtime's queued Runs are placed."""
        return 1.0 if self.queueShare is None else self.queueShare

    def queue_limit(self, *, runtime_limit: int) -> tuple[int, str] | None:
        """The most of this tenant's Runs a runtime's queue (of ``runtime_limit``) may hold, and
        which setting says so; None when only the runtime's own limit applies."""
        limits: list[tuple[int, str]] = []
        if self.queueLimit is not None:
            limits.append((self.queueLimit, f"queueLimit of {self.queueLimit}"))
        if self.queueShare is not None:
            room = math.ceil(self.queueShare * runtime_limit - 1e-9)
            limits.append((room, f"queueShare {self.queueShare:g} of {runtime_limit} ({room} Runs)"))
        if not limits:
            return None
        return min(limits, key=lambda limit: limit[0])


# The policy of a run that names no tenant: the shared pool.
SHARED_POLICY = TenantPolicy()


class AdmissionRequest(ApiModel):
    """A Run asking its runtime's pool for a slot. Tenant identity travels here, never in labels."""

    runUid: RunUidField
    namespace: Annotated[str, _label("namespace")]
    name: Annotated[str, _label("name")]
    runtime: RuntimeField
    tenant: TenantName | None = None
    # The platform's policy for ``tenant``. None for a named tenant means the platform has none:
    # the run is rejected (TenantNotAllowed). None without a tenant means SHARED_POLICY.
    tenancy: TenantPolicy | None = None
    requestedAt: AwareDatetime
    providerHint: ProviderName | None = None

    @model_validator(mode="after")
    def _anonymous_is_shared(self) -> Self:
        if self.tenant is None and self.tenancy is not None and self.tenancy.mode is not TenancyMode.Shared:
            raise ValueError("tenancy: a run without a tenant can only use the Shared mode")
        return self

    @property
    def policy(self) -> TenantPolicy | None:
        if self.tenancy is not None:
            return self.tenancy
        return SHARED_POLICY if self.tenant is None else None


class RejectReason(StrEnum):
    QueueFull = "QueueFull"
    NoProvider = "NoProvider"
    TenantNotAllowed = "TenantNotAllowed"
    RuntimeUnknown = "RuntimeUnknown"
    MaxHostsReached = "MaxHostsReached"


class ScaleOutReason(StrEnum):
    NoVisibleCapacity = "NoVisibleCapacity"  # admission found no capacity the run's tenant may see
    BelowMinHosts = "BelowMinHosts"  # the runtime's warm minimum


class _HostScope(ApiModel):
    """The scope of a host a scale-out will create: owner ``tenant`` (None: shared) and ``policy``."""

    tenant: TenantName | None = None
    policy: TenantPolicy = SHARED_POLICY

    @model_validator(mode="after")
    def _owner_matches_mode(self) -> Self:
        if self.policy.mode is TenancyMode.Shared and self.tenant is not None:
            raise ValueError("tenant: a Shared scale-out creates an unowned host; tenant must be empty")
        if self.policy.mode is not TenancyMode.Shared and self.tenant is None:
            raise ValueError(f"tenant: a {self.policy.mode} scale-out needs the owning tenant")
        return self

    @property
    def tenancy(self) -> TenancyMode:
        return self.policy.mode

    @property
    def tenantGroup(self) -> str | None:
        return None if self.policy.mode is TenancyMode.Shared else self.policy.group


class AssignToInstance(ApiModel):
    kind: Literal["AssignToInstance"] = "AssignToInstance"
    hostId: HostIdField
    hostUid: HostUidField


class QueueGlobally(ApiModel):
    kind: Literal["QueueGlobally"] = "QueueGlobally"
    # Requests ahead of this one in the pool's FIFO (0: the head).
    position: StrictInt = Field(ge=0)


class RequestScaleOut(_HostScope):
    """Ask for one more host. The run waits in the queue at ``position`` until it is re-admitted:
    a scale-out never dispatches a run, the pool re-admits its queued runs once the host is ready.
    ``policy`` is the requesting tenant's settings, carried to the provider."""

    kind: Literal["RequestScaleOut"] = "RequestScaleOut"
    reason: ScaleOutReason
    # Resolved from: the request's hint, then the runtime's provider, then "process".
    provider: ProviderName
    position: StrictInt = Field(ge=0)


class Reject(ApiModel):
    kind: Literal["Reject"] = "Reject"
    reason: RejectReason
    message: StatusMessage = ""


Decision = Annotated[
    AssignToInstance | QueueGlobally | RequestScaleOut | Reject,
    Field(discriminator="kind"),
]


class ScaleOutStatus(StrEnum):
    """Requested ─▶ Provisioning ─▶ Fulfilled;  Requested | Provisioning ─▶ Failed."""

    Requested = "Requested"  # recorded; no host yet
    Provisioning = "Provisioning"  # the provider created the host; waiting until it serves
    Fulfilled = "Fulfilled"  # the host is Ready and registered; queued runs are re-admitted
    Failed = "Failed"


PENDING_SCALE_OUT: frozenset[ScaleOutStatus] = frozenset(
    {ScaleOutStatus.Requested, ScaleOutStatus.Provisioning}
)

_SCALE_OUT_TRANSITIONS: dict[ScaleOutStatus, frozenset[ScaleOutStatus]] = {
    ScaleOutStatus.Requested: frozenset({ScaleOutStatus.Provisioning, ScaleOutStatus.Failed}),
    ScaleOutStatus.Provisioning: frozenset({ScaleOutStatus.Fulfilled, ScaleOutStatus.Failed}),
    ScaleOutStatus.Fulfilled: frozenset(),
    ScaleOutStatus.Failed: frozenset(),
}


def can_transition_scale_out(src: ScaleOutStatus, dst: ScaleOutStatus) -> bool:
    return dst in _SCALE_OUT_TRANSITIONS[src]


class ScaleOutRequest(_HostScope):
    """A persisted scale-out (ScaleOutWorkflow ``scaleout/{runtime}/{requestId}``)."""

    requestId: Identity
    runtime: RuntimeField
    provider: ProviderName
    reason: ScaleOutReason
    # Slots the new host will bring (the runtime's ``runs``).
    slots: StrictInt = Field(ge=1)
    # The run whose admission asked for it, if any (None: the runtime's warm minimum).
    runUid: RunUidField | None = None
    requestedAt: AwareDatetime
    status: ScaleOutStatus = ScaleOutStatus.Requested
    hostId: HostIdField | None = None
    hostUid: HostUidField | None = None
    failure: ProviderFailure | None = None

    @model_validator(mode="after")
    def _status_fields(self) -> Self:
        if self.status in (ScaleOutStatus.Provisioning, ScaleOutStatus.Fulfilled) and (
            self.hostId is None or self.hostUid is None
        ):
            raise ValueError(f"status: a {self.status} scale-out names its hostId and hostUid")
        if (self.status is ScaleOutStatus.Failed) != (self.failure is not None):
            raise ValueError("failure: set exactly when status is Failed")
        return self

    @property
    def pending(self) -> bool:
        return self.status in PENDING_SCALE_OUT
