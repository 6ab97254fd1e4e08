"""A Function's side effects (FunctionWorkflow): asking one of its replica Runs to delete itself."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity
from temporalio.client import Client, WorkflowUpdateStage
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from kruntimes.contracts.function import DeleteReplicaInput, DeleteReplicaResult
from kruntimes.contracts.names import UPDATE_DELETE

# One RPC of the delete's start: the activity's own timeout bounds the retries.
DELETE_RPC_TIMEOUT = timedelta(seconds=10)


class FunctionActivities:
    def __init__(self, client: Client) -> None:
        self.client = client

    @activity.defn(name="delete_replica")
    async def delete_replica(self, input: DeleteReplicaInput) -> DeleteReplicaResult:
        """Start the replica's delete update (its RunWorkflow: cancel, clean up, end) and return
        once it is accepted: the Run tells its Function when it has ended. The replica's own run
        id is addressed, never a later Run of the same name. Not accepted: that run is closed."""
        handle = self.client.get_workflow_handle(input.workflowId, run_id=input.runId or None)
        try:
            await handle.start_update(
                UPDATE_DELETE, wait_for_stage=WorkflowUpdateStage.ACCEPTED, rpc_timeout=DELETE_RPC_TIMEOUT
            )
        except RPCError as err:
            if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION):
                return DeleteReplicaResult(accepted=False)
            raise ApplicationError(
                f"delete {input.workflowId}: {err.status.name}", type="DeleteFailed"
            ) from err
        return DeleteReplicaResult(accepted=True)
