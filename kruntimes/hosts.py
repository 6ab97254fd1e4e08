"""The host provider contract: what a provider is asked to create (HostSpec), and what it reports
back (CreatedHost). Activities, the scale-out workflow and the worker share it.

Besides create, delete and probe, a provider proves that a host incarnation cannot serve: `gone`
(no side effects) and `fence` (make it so, then prove it), the step before the Runs of a lost host
move (activities.hosts.base.HostProvider says what counts as proof for each kind of provider)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, AwareDatetime, Field

from kruntimes.api._base import ApiModel, StrictInt
from kruntimes.api.names import validate_dns1123_label
from kruntimes.scheduling.failures import ProviderName
from kruntimes.scheduling.model import Identity, RuntimeName, TenantName


def _host_id(value: str) -> str:
    # Host ids name files (process), pods (kubernetes) and hostnames: a DNS-1123 label.
    return validate_dns1123_label(value, field="hostId")


HostId = Annotated[str, AfterValidator(_host_id)]
# host:port of a Runtime Server, e.g. "127.0.0.1:50051"; checked for shape where it is dialled.
Address = Annotated[str, Field(min_length=1, max_length=261)]


class HostSpec(ApiModel):
    """One host to create: which runtime it serves, its name, and the provider that makes it."""

    runtime: RuntimeName
    hostId: HostId
    adapter: Annotated[str, Field(min_length=1)]
    provider: ProviderName
    tenant: TenantName | None = None
    # Where the process provider keeps records, logs and the host's workspaces.
    stateDir: Annotated[str, Field(min_length=1)]
    # Address-space limit of each function process; None keeps the host's default.
    addressSpaceMiB: StrictInt | None = Field(default=None, ge=16)
    # The endpoint the attach provider adopts.
    attachAddress: Address | None = None
    # Where the host sends route heartbeats (the gateways' heartbeat addresses), and how often.
    gateways: list[Address] = Field(default_factory=list, max_length=16)
    heartbeatIntervalSeconds: float = Field(default=5.0, gt=0, le=300)


class CreatedHost(ApiModel):
    """A host that serves: where it is, which incarnation it is (hostUid), and who made it."""

    provider: ProviderName
    runtime: RuntimeName
    hostId: HostId
    hostUid: Identity
    address: Address
    # The host's process when the provider started it locally; None for attached or remote hosts.
    pid: StrictInt | None = Field(default=None, ge=1)
    createdAt: AwareDatetime
