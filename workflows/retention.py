"""RetentionWorkflow (retention/{run uid}): a finished Run's execution stays readable for its
spec.ttlSecondsAfterFinished (24 h without one, at once after a delete), then is deleted from
Temporal.

Started by the RunWorkflow just before it closes, and left running when it does (parent close
policy ABANDON), with the Run's search attributes and final phase: while it runs, it is what
lists the finished Run (kruntimes.wire.search.LISTED). It deletes that one execution by its run
id: a later Run of the same name is another execution and is left alone. An execution still
open is waited for (the delete would terminate it); one already gone is done.

`delete_now` (a closed Run's delete) ends the wait: it indexes KrtPhase=Deleted first, so the
Run leaves the listing before Temporal removes the execution, which visibility shows later.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from kruntimes.contracts.names import SIGNAL_DELETE_NOW
    from kruntimes.contracts.retention import DeleteExecutionInput, RetentionInput
    from kruntimes.wire import search, search_typed, summaries

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
    def __init__(self) -> None:
        self._now = False

    @workflow.signal(name=SIGNAL_DELETE_NOW)
    def delete_now(self) -> None:
        self._now = True

    @workflow.run
    async def run(self, input: RetentionInput) -> bool:
        """True once the execution is deleted, False when it was gone already."""
        if input.seconds > 0:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._now,
                    timeout=input.seconds,
                    timeout_summary=summaries.summary(f"ttlSecondsAfterFinished {input.seconds:g} s"),
                )
        marked = workflow.info().typed_search_attributes.get(search_typed.KRT_PHASE) == search.DELETED
        if not marked:  # the Run leaves the listing before its execution is deleted
            workflow.upsert_search_attributes([search_typed.KRT_PHASE.value_set(search.DELETED)])
        deleted: bool = await workflow.execute_activity(
            "delete_execution",
            DeleteExecutionInput(workflowId=input.workflowId, runId=input.runId),
            result_type=bool,
            start_to_close_timeout=DELETE_TIMEOUT,
            retry_policy=DELETE_RETRY,
            summary=summaries.summary(f"delete {input.workflowId}"),
        )
        return deleted
