"""RetentionWorkflow (retention/{run uid}): a finished Run's execution stays readable for its
spec.ttlSecondsAfterFinished (24 h without one, at once after a delete), then is deleted from
Temporal.

Started by the RunWorkflow just before it closes, and left running when it does (parent close
policy ABANDON). It deletes that one execution by its run id: a later Run of the same name is
another execution and is left alone. An execution still open is waited for (the delete would
terminate it); one already gone is done.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from kruntimes.lifecycle import DeleteExecutionInput, RetentionInput

DELETE_TIMEOUT = timedelta(seconds=30)
# The Run closes right after it starts this workflow: a delete that finds it open is retried soon.
DELETE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=50,
)


@workflow.defn(name="RetentionWorkflow")
class RetentionWorkflow:
    @workflow.run
    async def run(self, input: RetentionInput) -> bool:
        """True once the execution is deleted, False when it was gone already."""
        if input.seconds > 0:
            await workflow.sleep(input.seconds, summary=f"ttlSecondsAfterFinished {input.seconds:g} s")
        deleted: bool = await workflow.execute_activity(
            "delete_execution",
            DeleteExecutionInput(workflowId=input.workflowId, runId=input.runId),
            result_type=bool,
            start_to_close_timeout=DELETE_TIMEOUT,
            retry_policy=DELETE_RETRY,
            summary=f"delete {input.workflowId}",
        )
        return deleted
