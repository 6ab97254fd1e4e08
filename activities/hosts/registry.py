"""The host providers a worker can run, registered by name: one line each in `PROVIDERS`.

A provider kind (`ProviderKind`, activities/hosts/base.py) adds its own `krt worker` flags and
makes its options (its config model) from them, checks the platform config before anything is
served, and starts its provider with its start-up tasks; what the activities ask of a provider
beyond the `HostProvider` calls are capabilities it has or not (`LocalHosts`, `FencingProvider`,
`OrphanCollecting`), never its name.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from temporalio.runtime import Runtime

from kruntimes.activities.hosts.attach import AttachHosts
from kruntimes.activities.hosts.base import HostManager, HostProvider, ProviderKind, ProviderSetup
from kruntimes.activities.hosts.circuit import CircuitBreakers
from kruntimes.activities.hosts.kubernetes_hosts import KubernetesHosts
from kruntimes.activities.hosts.process import ProcessHosts
from kruntimes.decisions.scheduling.model import PROVIDER_LABEL, Host

if TYPE_CHECKING:
    from temporalio.client import Client

# In the order a worker starts them (and tells its pools their names).
PROVIDERS: Mapping[str, ProviderKind] = MappingProxyType(
    {
        kind.name: kind
        for kind in (
            ProcessHosts(),
            AttachHosts(),
            KubernetesHosts(),
        )
    }
)

# The provider of a host that carries no provider label: hosts were labelled once there was more
# than this one.
UNLABELLED = ProcessHosts.name


def provider_of(host: Host) -> str:
    """The name of the provider that started `host`."""
    return host.labels.get(PROVIDER_LABEL, UNLABELLED)


def check_providers(setup: ProviderSetup) -> None:
    """Every registered provider's check of the configuration (ValueError, ProviderConfigError)."""
    for kind in PROVIDERS.values():
        kind.check(setup)


@contextlib.asynccontextmanager
async def started_providers(setup: ProviderSetup, *, client: Client | None) -> AsyncIterator[HostManager]:
    """The manager of every provider the configuration needs, their start-up tasks running until
    the context exits; ProviderConfigError before anything starts when one cannot be used. Their
    operations' metrics go to `client`'s Temporal runtime, their breakers are the config's."""
    async with contextlib.AsyncExitStack() as stack:
        providers: list[HostProvider] = []
        for kind in PROVIDERS.values():
            provider = await stack.enter_async_context(kind.start(setup, client=client))
            if provider is not None:
                providers.append(provider)
        # The client's Temporal runtime serves the worker's metrics (`--metrics-address`).
        meter = None
        if client is not None:
            meter = (client.service_client.config.runtime or Runtime.default()).metric_meter
        yield HostManager(providers, meter=meter, breakers=CircuitBreakers(setup.config.providerCircuit))
