"""ScheduledRunWorkflow (scheduled/{namespace}/{schedule}-<time>): what a `krt schedule` starts.

Each start creates one task Run, `<schedule>-<scheduled time>` (e.g. `nightly-20250101120000`)
with a uid of its own, as a child RunWorkflow on the Runs' queue, and closes as that Run does:
Completed with its final status, or Failed with its reason. The schedule's overlap policy counts
this workflow, so `skip` skips a start while the previous Run still runs. The Run outlives this
workflow (parent close policy ABANDON): terminating the launcher never orphans a Run.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import ApplicationError, ChildWorkflowError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from kruntimes.api.status import RunStatus
    from kruntimes.contracts.names import run_workflow_id, scheduled_run_name
    from kruntimes.contracts.run import RunInput
    from kruntimes.contracts.scheduled import ScheduledRunInput
    from kruntimes.wire import search_typed, summaries
    from kruntimes.workflows.common import failure_text, failure_type


# Set by the schedule on what it starts: the action's scheduled time (a trigger's is its own).
SCHEDULED_START = SearchAttributeKey.for_datetime("TemporalScheduledStartTime")


@workflow.defn(name="ScheduledRunWorkflow")
class ScheduledRunWorkflow:
    @workflow.run
    async def run(self, input: ScheduledRunInput) -> RunStatus:
        info = workflow.info()
        at = info.typed_search_attributes.get(SCHEDULED_START) or workflow.now()
        template = input.run
        metadata = template.metadata._replace(
            name=scheduled_run_name(input.schedule, at), uid=str(workflow.uuid4())
        )
        run = template._replace(metadata=metadata)
        try:
            status: RunStatus = await workflow.execute_child_workflow(
                "RunWorkflow",
                RunInput(run=run),
                id=run_workflow_id(metadata.namespace, metadata.name),
                task_queue=info.task_queue,
                result_type=RunStatus,
                parent_close_policy=ParentClosePolicy.ABANDON,
                search_attributes=search_typed.at_start(run),
                static_summary=summaries.run_summary(run),
                static_details=summaries.run_details(run),
            )
        except ChildWorkflowError as err:
            raise ApplicationError(
                f"run {metadata.namespace}/{metadata.name}: {failure_text(err)}",
                type=failure_type(err),
                non_retryable=True,
            ) from err
        return status
