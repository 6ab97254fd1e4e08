"""ReconcileWorkflow's contract: its input and the report of a round."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from kruntimes.api._base import ApiModel, StatusMessage
from kruntimes.api.ids import RuntimeName
from kruntimes.contracts.names import TASK_QUEUE

MAX_REPORTED = 100


class ReconcileReport(ApiModel):
    """What one reconciliation round found and did (bounded lists; `actions` counts them all)."""

    runtime: RuntimeName = RuntimeName("")
    at: datetime
    unregistered: list[str] = Field(default_factory=list, max_length=MAX_REPORTED)
    released: list[str] = Field(default_factory=list, max_length=MAX_REPORTED)
    deletedHosts: list[str] = Field(default_factory=list, max_length=MAX_REPORTED)
    removedWorkspaces: list[str] = Field(default_factory=list, max_length=MAX_REPORTED)
    registrationsLost: list[str] = Field(default_factory=list, max_length=MAX_REPORTED)
    supervised: list[str] = Field(default_factory=list, max_length=MAX_REPORTED)
    errors: list[StatusMessage] = Field(default_factory=list, max_length=MAX_REPORTED)
    actions: int = 0


class ReconcileInput(ApiModel):
    runtime: RuntimeName
    poolWorkflowId: str
    stateDir: str
    runTaskQueue: str = TASK_QUEUE
    intervalSeconds: float | None = Field(default=60.0, gt=0)  # None: only when asked
    # What is younger than this is being created right now and is left alone (twice the
    # runtime's assignment timeout).
    graceSeconds: float = Field(default=120.0, ge=0)
    # For the HostWorkflows it starts again (hosts whose supervisor is gone).
    watchIntervalSeconds: float = Field(default=5.0, gt=0, le=300)
    assignmentTimeoutSeconds: float = Field(default=60.0, gt=0)
    last: ReconcileReport | None = None  # carried across continue-as-new
