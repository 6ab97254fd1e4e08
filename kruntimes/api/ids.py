"""The identifiers that look alike but must never be swapped, each its own type for mypy.

At run time each is a plain `str` (pydantic validates and serialises it as one); the types only
stop a host id from being passed where a Run uid is meant. Values from outside (a request, a
manifest, a Kubernetes object) are validated by kruntimes.api.names before they are wrapped.
"""

from __future__ import annotations

from typing import NewType

RunUid = NewType("RunUid", str)
"""A Run's immutable uid: a canonical UUID, one per created Run."""
HostId = NewType("HostId", str)
"""A host's name within its runtime (`python-3`), reused by a replacement host."""
HostUid = NewType("HostUid", str)
"""One incarnation of a host: a new uid each time a host of the same id is created."""
Namespace = NewType("Namespace", str)
"""The namespace a Run and its bindings live in (a DNS-1123 label)."""
RuntimeName = NewType("RuntimeName", str)
"""A runtime of the platform configuration (`python`), the pool its Runs share."""
