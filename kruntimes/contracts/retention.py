"""RetentionWorkflow's contract: a closed Run kept queryable, then deleted."""

from __future__ import annotations

from pydantic import Field

from kruntimes.api._base import ApiModel


class RetentionInput(ApiModel):
    """Delete one closed execution of a Run (by run id: a later Run of the same name is another
    execution) from Temporal after `seconds`."""

    workflowId: str
    runId: str
    seconds: float = Field(ge=0)


class DeleteExecutionInput(ApiModel):
    workflowId: str
    runId: str
