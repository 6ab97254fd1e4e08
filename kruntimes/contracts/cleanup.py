"""CleanupWorkflow's contract: its input and result."""

from __future__ import annotations

from kruntimes.api._base import ApiModel


class CleanupInput(ApiModel):
    runUid: str
    attempt: int
    runtime: str
    address: str | None = None  # the host, when the Run had one
    registrationId: str | None = None
    task: bool = False
    graceSeconds: float = 10.0
    # The host is proven gone (fenced): nothing to unregister there, no call to make.
    hostGone: bool = False
    hostId: str = ""
    hostUid: str = ""
    provider: str = ""


class CleanupResult(ApiModel):
    unregistered: bool
    released: bool
