"""The attach provider: adopt a Runtime Server that something else runs (and keeps running)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from kruntimes.activities.hosts._rpc import HostRpcError, identify, serves, stop_registrations, unregister_all
from kruntimes.activities.hosts.base import Fenced, ProviderSetup, options_of, spec_error
from kruntimes.api._base import ApiModel
from kruntimes.contracts.providers import CreatedHost, HostSpec
from kruntimes.decisions.scheduling.failures import FailureReason, ProviderError, ProviderOperation

if TYPE_CHECKING:
    from temporalio.client import Client

NAME = "attach"


class AttachProvider:
    """Hosts at known addresses (``spec.attachAddress``); delete forgets them, never stops them."""

    def __init__(self, *, name: str = NAME, rpc_timeout_s: float = 5.0) -> None:
        self.name = name
        self.rpc_timeout_s = rpc_timeout_s

    async def create(self, spec: HostSpec) -> CreatedHost:
        if spec.attachAddress is None:
            raise self._error(FailureReason.EndpointMissing, spec, "attach needs spec.attachAddress")
        try:
            identity = await identify(spec.attachAddress, timeout_s=self.rpc_timeout_s)
        except HostRpcError as e:
            raise self._error(e.reason, spec, str(e)) from e
        if identity.runtime != spec.runtime:
            raise self._error(
                FailureReason.OperationRejected,
                spec,
                f"{spec.attachAddress} serves runtime {identity.runtime!r}, not {spec.runtime!r}",
            )
        if identity.host_id != spec.hostId:  # assignments name the host by the id it was issued
            raise self._error(
                FailureReason.OperationRejected,
                spec,
                f"{spec.attachAddress} is host {identity.host_id!r}, not {spec.hostId!r}",
            )
        return CreatedHost(
            provider=self.name,
            runtime=spec.runtime,
            hostId=spec.hostId,
            hostUid=identity.host_uid,
            address=spec.attachAddress,
            pid=None,
            createdAt=datetime.now(UTC),
        )

    async def delete(self, *, runtime: str, host_id: str, host_uid: str) -> bool:
        return False

    async def probe(self, host: CreatedHost) -> bool:
        return await serves(host, timeout_s=self.rpc_timeout_s)

    async def gone(self, host: CreatedHost) -> bool:
        """Proven only when another incarnation answers at its address (it is not ours to see)."""
        try:
            identity = await identify(host.address, timeout_s=self.rpc_timeout_s)
        except HostRpcError:
            return False
        return identity.host_uid != host.hostUid

    async def fence(self, host: CreatedHost) -> Fenced:
        """Another incarnation answers (the watched one is gone), or the host stops taking
        registrations (FenceHost) and then acknowledges unregistering every one it holds: in
        that order, so none can arrive between the listing and the unregistering. Unreachable:
        not fenced yet. A host without FenceHost (older) is unregistered as before, and the
        verdict says it was not atomic."""
        try:
            identity = await identify(host.address, timeout_s=self.rpc_timeout_s)
            if identity.host_uid != host.hostUid:
                return Fenced(True, f"another incarnation ({identity.host_uid}) answers at {host.address}")
            stopped = await stop_registrations(
                host.address, host_uid=host.hostUid, timeout_s=self.rpc_timeout_s
            )
            count = await unregister_all(host.address, host_uid=host.hostUid, timeout_s=self.rpc_timeout_s)
        except HostRpcError as e:
            return Fenced(False, f"cannot reach {host.address}: {e}")
        how = "stopped taking registrations and" if stopped else "(without FenceHost: not atomic)"
        return Fenced(True, f"the host {how} acknowledged unregistering its {count} registration(s)")

    def _error(self, reason: FailureReason, spec: HostSpec, message: str) -> ProviderError:
        return spec_error(
            reason, spec, provider=self.name, operation=ProviderOperation.Attach, message=message
        )


class AttachOptions(ApiModel):
    """The attach provider's own settings."""

    rpcTimeoutSeconds: float = 5.0  # each call to an adopted host


class AttachHosts:
    """The attach provider's registration: always started, with no start-up tasks."""

    name = NAME

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        pass

    def options_from(self, args: argparse.Namespace) -> AttachOptions | None:
        return None

    def check(self, setup: ProviderSetup) -> None:
        options_of(setup, self.name, AttachOptions)

    @contextlib.asynccontextmanager
    async def start(self, setup: ProviderSetup, *, client: Client | None) -> AsyncIterator[AttachProvider]:
        options = options_of(setup, self.name, AttachOptions)
        yield AttachProvider(name=self.name, rpc_timeout_s=options.rpcTimeoutSeconds)
