"""CleanupWorkflow's contract: its input and result."""

from __future__ import annotations

from kruntimes.api._base import ApiModel
from kruntimes.api.ids import HostId, HostUid, RuntimeName, RunUid


class CleanupInput(ApiModel):
    runUid: RunUid
    attempt: int
    runtime: RuntimeName
    address: str | None = None  # the host, when the Run had one
    registrationId: str | None = None
    task: bool = False
    graceSeconds: float = 10.0
    # The host is proven gone (fenced): nothing to unregister there, no call to make.
    hostGone: bool = False
    hostId: HostId = HostId("")
    hostUid: HostUid = HostUid("")
    provider: str = ""


class CleanupResult(ApiModel):
    unregistered: bool
    released: bool
