"""Host providers and the host manager: create, delete, probe and fence runtime hosts.

``process`` starts detached local hosts (the embedded default), ``attach`` adopts running ones.
Every failure is a ``kruntimes.scheduling.failures.ProviderError``.
"""

from __future__ import annotations

import os

from activities.hosts.attach import AttachProvider
from activities.hosts.base import HostManager, HostProvider, provider_error
from activities.hosts.process import ProcessProvider, list_records, stop_all
from kruntimes.hosts import CreatedHost, HostSpec

__all__ = [
    "AttachProvider",
    "CreatedHost",
    "HostManager",
    "HostProvider",
    "HostSpec",
    "ProcessProvider",
    "default_manager",
    "list_records",
    "provider_error",
    "stop_all",
]


def default_manager(*, state_dir: str | os.PathLike[str] | None = None) -> HostManager:
    """The providers a worker registers; ``state_dir`` lets the process provider find its records."""
    return HostManager(
        [
            ProcessProvider(state_dir=state_dir),
            AttachProvider(),
            # KubernetesProvider() is registered here once it exists.
        ]
    )
