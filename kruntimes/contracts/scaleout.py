"""ScaleOutWorkflow's contract: its input."""

from __future__ import annotations

from pydantic import Field

from kruntimes.api._base import ApiModel
from kruntimes.api.ids import HostId
from kruntimes.contracts.providers import HostSandbox
from kruntimes.decisions.scheduling.model import (
    ScaleOutRequest,
)


class ScaleOutInput(ApiModel):
    request: ScaleOutRequest
    hostId: HostId
    adapter: str
    capacity: int
    stateDir: str
    poolWorkflowId: str
    gateways: list[str] = Field(default_factory=list)
    heartbeatIntervalSeconds: float = 5.0
    sandbox: HostSandbox | None = None  # None (inputs from before isolation): the host's defaults
    assignmentTimeoutSeconds: float = Field(default=60.0, gt=0)  # the HostWorkflow's stuck timer
