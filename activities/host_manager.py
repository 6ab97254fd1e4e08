"""Activities that create and delete runtime hosts through the host manager (activities/hosts)."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from kruntimes.activities.heartbeat import heartbeating
from kruntimes.activities.hosts._rpc import HostRpcError, identify
from kruntimes.activities.hosts.base import HostManager
from kruntimes.activities.hosts.registry import provider_of
from kruntimes.contracts.host import DeleteHostInput, FenceInput, FenceResult
from kruntimes.contracts.hostcalls import HostCall
from kruntimes.contracts.providers import CreatedHost, HostSpec
from kruntimes.contracts.run import ProbeInput, ProbeResult
from kruntimes.decisions.scheduling.failures import ProviderError
from kruntimes.decisions.scheduling.model import Host

__all__ = ["DeleteHostInput", "HostActivities", "ProbeActivities"]


def _application_error(err: ProviderError) -> ApplicationError:
    failure = err.failure
    return ApplicationError(
        f"{failure.provider} {failure.operation} {failure.host or ''}: {failure.message}".replace("  ", " "),
        failure.model_dump(mode="json"),
        type=str(failure.reason),
        non_retryable=not failure.retryable,
    )


class HostActivities:
    """`gateways`: the gateways' heartbeat addresses this worker was started with; a host it
    creates reports to those rather than to the ones in the workflow's input, which may be older
    (the pool's config from before a restart of the platform)."""

    def __init__(self, manager: HostManager, *, gateways: list[str] | None = None) -> None:
        self.manager = manager
        self.gateways = gateways

    @activity.defn(name="create_host")
    async def create_host(self, spec: HostSpec) -> CreatedHost:
        if self.gateways:
            spec = spec._replace(gateways=self.gateways)
        try:
            return await heartbeating(self.manager.create(spec))
        except ProviderError as err:
            raise _application_error(err) from err

    @activity.defn(name="fence_host")
    async def fence_host(self, input: FenceInput) -> FenceResult:
        """Make that host incarnation unable to serve, and say whether that is proven."""
        try:
            fenced = await heartbeating(self.manager.fence(input.created))
        except ProviderError as err:
            raise _application_error(err) from err
        return FenceResult(fenced=fenced.fenced, how=fenced.how)

    async def gone(self, call: HostCall, address: str) -> bool:
        """Whether the host a call went to is proven unable to serve (no side effects); False
        when unsure, or when the call does not say which host and provider it went to."""
        if not (call.provider and call.runtime and call.hostId and call.hostUid):
            return False
        try:
            host = CreatedHost(
                provider=call.provider,
                runtime=call.runtime,
                hostId=call.hostId,
                hostUid=call.hostUid,
                address=address,
                createdAt=datetime.now(UTC),
            )
            return await self.manager.gone(host)
        except (ProviderError, ValidationError):
            return False

    @activity.defn(name="delete_host")
    async def delete_host(self, input: DeleteHostInput) -> bool:
        try:
            return await self.manager.delete(
                provider=input.provider, runtime=input.runtime, host_id=input.hostId, host_uid=input.hostUid
            )
        except ProviderError as err:
            raise _application_error(err) from err


PROBE_TIMEOUT_S = 3.0


async def _proven_gone(host: Host, state_dir: str, manager: HostManager) -> bool:
    """Fencing: a host is gone only when its uid is gone — its provider proves it from its own
    records (a pod's uid no longer exists, or it is deleting and out of routing), another
    incarnation answers at its address, or (local hosts) its recorded process no longer exists.
    An unreachable host that may still run is not gone: its Runs move elsewhere only once it is
    proven gone, so a Run never runs on two hosts at once."""
    provider = provider_of(host)
    verdict = await manager.verdict(
        provider=provider,
        runtime=host.runtime,
        host_id=host.hostId,
        host_uid=host.hostUid,
        address=host.address,
    )
    if verdict is not None:
        return verdict
    try:
        identity = await identify(host.address or "", timeout_s=PROBE_TIMEOUT_S)
    except HostRpcError:
        identity = None
    if identity is not None:
        return identity.host_uid != host.hostUid
    local = manager.local(provider)
    if local is None or not state_dir:
        return False
    record = next((r for r in local.records(state_dir) if r.hostId == host.hostId), None)
    return record is None or record.hostUid != host.hostUid or not local.running(record)


class ProbeActivities:
    def __init__(self, manager: HostManager) -> None:
        self.manager = manager  # whose providers may prove a host gone from their own records

    @activity.defn(name="probe_hosts")
    async def probe_hosts(self, input: ProbeInput) -> ProbeResult:
        lost = [h.hostUid for h in input.hosts if await _proven_gone(h, input.stateDir, self.manager)]
        return ProbeResult(lost=lost)
