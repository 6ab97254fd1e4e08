"""Host providers and the host manager: create, delete, probe and fence runtime hosts.

Each provider registers by name in ``registry.PROVIDERS``: ``process`` starts detached local
hosts (the embedded default), ``attach`` adopts running ones, ``kubernetes`` runs pods (started
when a runtime uses it). Every failure is a ``kruntimes.decisions.scheduling.failures.ProviderError``.
"""

from __future__ import annotations

from kruntimes.activities.hosts.attach import AttachProvider
from kruntimes.activities.hosts.base import FencingProvider, HostManager, HostProvider, provider_error
from kruntimes.activities.hosts.process import ProcessProvider, list_records, stop_all
from kruntimes.contracts.providers import CreatedHost, HostSpec

__all__ = [
    "AttachProvider",
    "CreatedHost",
    "FencingProvider",
    "HostManager",
    "HostProvider",
    "HostSpec",
    "ProcessProvider",
    "list_records",
    "provider_error",
    "stop_all",
]
