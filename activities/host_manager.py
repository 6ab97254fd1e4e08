"""Activities that create and delete runtime hosts through the host manager (activities/hosts)."""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.heartbeat import heartbeating
from activities.hosts.base import HostManager
from activities.hosts.model import CreatedHost, HostSpec
from kruntimes.api._base import ApiModel
from kruntimes.scheduling.failures import ProviderError


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
