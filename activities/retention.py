"""Deleting a closed workflow execution from Temporal (RetentionWorkflow)."""

from __future__ import annotations

from temporalio import activity
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from kruntimes.contracts.retention import DeleteExecutionInput


class RetentionActivities:
    def __init__(self, client: Client) -> None:
        self.client = client

    @activity.defn(name="delete_execution")
    async def delete_execution(self, input: DeleteExecutionInput) -> bool:
        """Delete that closed execution; False when it is gone already. An open one is an error
        the workflow retries: deleting it would terminate it."""
        handle = self.client.get_workflow_handle(input.workflowId, run_id=input.runId)
        try:
            description = await handle.describe()
            if description.status == WorkflowExecutionStatus.RUNNING:
                raise ApplicationError(f"{input.workflowId} has not closed yet", type="ExecutionOpen")
            await self.client.workflow_service.delete_workflow_execution(
                DeleteWorkflowExecutionRequest(
                    namespace=self.client.namespace,
                    workflow_execution=WorkflowExecution(workflow_id=input.workflowId, run_id=input.runId),
                )
            )
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            message = f"delete {input.workflowId}: {err.status.name}"
            raise ApplicationError(message, type="DeleteFailed") from err
        return True
