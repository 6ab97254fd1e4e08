"""The host side of every language adapter, by the name its description has in
`kruntimes.api.adapters` (tests/contracts/adapters_test.py holds the two lists equal)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from kruntimes.runtime.adapters import bash, krm, python
from kruntimes.runtime.adapters.host import HostAdapter
from kruntimes.runtime.errors import InvalidRequest

HOST_ADAPTERS: Mapping[str, HostAdapter] = MappingProxyType(
    {a.name: a for a in (python.ADAPTER, bash.ADAPTER, krm.ADAPTER)}
)


def host_adapter(name: str) -> HostAdapter:
    try:
        return HOST_ADAPTERS[name]
    except KeyError:
        known = ", ".join(sorted(HOST_ADAPTERS))
        raise InvalidRequest(f"this host has no adapter {name!r:.80}; it has: {known}") from None
