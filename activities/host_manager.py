"""Activities that create and delete runtime hosts through the host manager (activities/hosts)."""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.heartbeat import heartbeating
from activities.hosts._rpc import HostRpcError, identify
from activities.hosts.base import HostManager
from activities.hosts.process import host_running, list_records
from kruntimes.api._base import ApiModel
from kruntimes.hosts import CreatedHost, HostSpec
from kruntimes.lifecycle import ProbeInput, ProbeResult
from kruntimes.scheduling.failures import ProviderError
from kruntimes.scheduling.model import Host


class DeleteHostInput(ApiModel):
    provider: str
    runtime: str
    hostId: str
    hostUid: str


def _application_error(err: ProviderError) -> ApplicationError:
    failure = err.failure
    return ApplicationError(
        f"{failure.provider} {failure.operation} {failure.host or ''}: {failure.message}".replace("  ", " "),
        failure.model_dump(mode="json"),
        type=str(failure.reason),
        non_retryable=not failure.retryable,
    )


class HostActivities:
    def __init__(self, manager: HostManager) -> None:
        self.manager = manager

    @activity.defn(name="create_host")
    async def create_host(self, spec: HostSpec) -> CreatedHost:
        try:
            return await heartbeating(self.manager.create(spec))
        except ProviderError as err:
            raise _application_error(err) from err

    @activity.defn(name="delete_host")
    async def delete_host(self, input: DeleteHostInput) -> bool:
        try:
            return await self.manager.delete(
                provider=input.provider, runtime=input.runtime, host_id=input.hostId, host_uid=input.hostUid
            )
        except ProviderError as err:
            raise _application_error(err) from err


PROBE_TIMEOUT_S = 3.0
PROVIDER_LABEL = "kruntimes.io/provider"


async def _proven_gone(host: Host, state_dir: str, manager: HostManager | None = None) -> bool:
    """Fencing: a host is gone only when its uid is gone — its provider proves it from its own
    records (a pod's uid no longer exists, or it is deleting and out of routing), another
    incarnation answers at its address, or (process hosts) its recorded process no longer exists.
    An unreachable host that may still run is not gone: its Runs move elsewhere only once it is
    proven gone, so a Run never runs on two hosts at once."""
    provider = host.labels.get(PROVIDER_LABEL, "process")
    if manager is not None:
        verdict = await manager.gone(
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
    if provider != "process" or not state_dir:
        return False
    record = next((r for r in list_records(state_dir) if r.hostId == host.hostId), None)
    return record is None or record.hostUid != host.hostUid or not host_running(record)


class ProbeActivities:
    def __init__(self, manager: HostManager | None = None) -> None:
        self.manager = manager  # whose providers may prove a host gone from their own records

    @activity.defn(name="probe_hosts")
    async def probe_hosts(self, input: ProbeInput) -> ProbeResult:
        lost = [h.hostUid for h in input.hosts if await _proven_gone(h, input.stateDir, self.manager)]
        return ProbeResult(lost=lost)
