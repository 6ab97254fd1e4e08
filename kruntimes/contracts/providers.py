"""The host provider contract: what a provider is asked to create (HostSpec), and what it reports
back (CreatedHost). Activities, the scale-out workflow and the worker share it.

Besides create, delete and probe, a provider proves that a host incarnation cannot serve: `gone`
(no side effects) and `fence` (make it so, then prove it), the step before the Runs of a lost host
move (kruntimes.activities.hosts.base.HostProvider says what counts as proof for each kind of provider)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, AwareDatetime, Field

from kruntimes.api._base import ApiModel, StrictInt
from kruntimes.api.ids import HostId
from kruntimes.api.names import validate_dns1123_label
from kruntimes.config.egress import MAX_ALLOW
from kruntimes.config.runtimes import OUTBOUND, NetworkMode, ResourceLimits, RuntimeConfig
from kruntimes.decisions.scheduling.failures import ProviderName
from kruntimes.decisions.scheduling.model import GroupName, HostUidField, RuntimeField, TenantName


def _host_id(value: str) -> str:
    # Host ids name files (process), pods (kubernetes) and hostnames: a DNS-1123 label.
    return validate_dns1123_label(value, field="hostId")


HostIdLabel = Annotated[HostId, AfterValidator(_host_id)]
# host:port of a Runtime Server, e.g. "127.0.0.1:50051"; checked for shape where it is dialled.
Address = Annotated[str, Field(min_length=1, max_length=261)]


class HostSandbox(ApiModel):
    """How a host isolates its functions (flags of `krt host`)."""

    isolation: Literal["uid", "same-user"] = "uid"
    network: NetworkMode = OUTBOUND
    # with network outbound: destinations its functions reach past the packet rules (CIDR:PORT)
    egressAllow: list[str] = Field(default_factory=list, max_length=MAX_ALLOW)
    limits: ResourceLimits = Field(default_factory=ResourceLimits)
    # `source.path` must lie under one of these; [] allows only inline sources
    allowedSourceRoots: list[str] = Field(default_factory=list, max_length=64)
    # directories no function may see, besides the host's own state directory
    hide: list[str] = Field(default_factory=list, max_length=64)
    # directories every function sees with their real content (data handed to functions)
    shared: list[str] = Field(default_factory=list, max_length=64)


class HostDefaults(ApiModel):
    """The platform's side of a host's isolation settings (the worker's flags and config)."""

    isolation: Literal["uid", "same-user"] = "uid"  # for runtimes that name none
    allowedSourceRoots: list[str] = Field(default_factory=list, max_length=64)
    hide: list[str] = Field(default_factory=list, max_length=64)  # e.g. the platform's state dir
    shared: list[str] = Field(default_factory=list, max_length=64)


def host_sandbox(runtime: RuntimeConfig, defaults: HostDefaults) -> HostSandbox:
    """The isolation settings of a host of `runtime`."""
    return HostSandbox(
        isolation=runtime.isolation or defaults.isolation,
        network=runtime.network_mode,
        egressAllow=runtime.egress_allow,
        limits=runtime.limits or ResourceLimits(),
        allowedSourceRoots=defaults.allowedSourceRoots,
        hide=defaults.hide,
        shared=defaults.shared,
    )


class HostSpec(ApiModel):
    """One host to create: which runtime it serves, its name, and the provider that makes it."""

    runtime: RuntimeField
    hostId: HostIdLabel
    adapter: Annotated[str, Field(min_length=1)]
    provider: ProviderName
    tenant: TenantName | None = None
    # The owner's tenant group: the host is every member's (a label of its pod, as its tenant).
    tenantGroup: GroupName | None = None
    # Where the process provider keeps records, logs and the host's workspaces.
    stateDir: Annotated[str, Field(min_length=1)]
    # The endpoint the attach provider adopts.
    attachAddress: Address | None = None
    # Where the host sends route heartbeats (the gateways' heartbeat addresses), and how often.
    gateways: list[Address] = Field(default_factory=list, max_length=16)
    heartbeatIntervalSeconds: float = Field(default=5.0, gt=0, le=300)
    sandbox: HostSandbox = Field(default_factory=HostSandbox)


class CreatedHost(ApiModel):
    """A host that serves: where it is, which incarnation it is (hostUid), and who made it."""

    provider: ProviderName
    runtime: RuntimeField
    hostId: HostIdLabel
    hostUid: HostUidField
    address: Address
    # The host's process when the provider started it locally; None for attached or remote hosts.
    pid: StrictInt | None = Field(default=None, ge=1)
    createdAt: AwareDatetime
    isolation: str = ""  # what the host says is in force, in words
