"""Host providers and the host manager: create, delete, probe and fence runtime hosts.

``process`` starts detached local hosts (the embedded default), ``attach`` adopts running ones,
``kubernetes`` (activities/hosts/kubernetes.py, registered when a runtime uses it) runs pods.
Every failure is a ``kruntimes.decisions.scheduling.failures.ProviderError``.
"""

from __future__ import annotations

import os

from kruntimes.activities.hosts.attach import AttachProvider
from kruntimes.activities.hosts.base import FencingProvider, HostManager, HostProvider, provider_error
from kruntimes.activities.hosts.process import ProcessProvider, list_records, stop_all
from kruntimes.contracts.providers import CreatedHost, HostSpec
from kruntimes.pki import HostIssuer

__all__ = [
    "AttachProvider",
    "CreatedHost",
    "FencingProvider",
    "HostManager",
    "HostProvider",
    "HostSpec",
    "ProcessProvider",
    "default_manager",
    "list_records",
    "provider_error",
    "stop_all",
]


def default_manager(
    *,
    state_dir: str | os.PathLike[str] | None = None,
    issuer: HostIssuer | None = None,
    kubernetes: HostProvider | None = None,
) -> HostManager:
    """The providers a worker registers; ``state_dir`` lets the process provider find its records,
    ``issuer`` gives the hosts it starts their certificates; ``kubernetes`` is the worker's
    KubernetesProvider when a runtime uses it (it needs the API)."""
    providers: list[HostProvider] = [ProcessProvider(state_dir=state_dir, issuer=issuer), AttachProvider()]
    if kubernetes is not None:
        providers.append(kubernetes)
    return HostManager(providers)
