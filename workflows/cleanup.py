"""CleanupWorkflow (cleanup/{run uid}): the finalizer every terminal Run goes through.

1. stop new invokes and let the in-flight one finish within the grace, then kill it
   (UnregisterFunction does both and removes the workspace; CancelTask for a task);
2. release the Run's slot (or queue entry) in the pool.
Each step is idempotent, so a retried or replayed cleanup is harmless. A host proven gone is not
called at all (`hostGone`: the Run's host was fenced), and a call that fails against a host found
proven gone meanwhile succeeds at once (the activities ask): what it would stop cannot run.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from kruntimes.contracts.cleanup import CleanupInput, CleanupResult
    from kruntimes.contracts.hostcalls import CancelTaskInput, HostCall, UnregisterInput
    from kruntimes.contracts.names import SIGNAL_RELEASE, pool_workflow_id
    from kruntimes.contracts.pool import ReleaseSignal
    from kruntimes.wire import summaries
    from kruntimes.workflows.common import CLEANUP_RETRY, failure_text


@workflow.defn(name="CleanupWorkflow")
class CleanupWorkflow:
    @workflow.run
    async def run(self, input: CleanupInput) -> CleanupResult:
        unregistered = False
        host = (
            HostCall(
                hostId=input.hostId, hostUid=input.hostUid, provider=input.provider, runtime=input.runtime
            )
            if input.hostUid
            else None
        )
        if input.address is not None and input.hostGone:
            unregistered = True  # fenced: nothing of it can serve, there is nobody to call
        elif input.address is not None:
            try:
                if input.task:
                    await workflow.execute_activity(
                        "cancel_task",
                        CancelTaskInput(
                            address=input.address, runUid=input.runUid, attempt=input.attempt, host=host
                        ),
                        result_type=bool,
                        start_to_close_timeout=timedelta(seconds=60),
                        retry_policy=CLEANUP_RETRY,
                        summary=summaries.summary(f"cancel task on {input.hostId or input.address}"),
                    )
                elif input.registrationId is not None:
                    await workflow.execute_activity(
                        "unregister_function",
                        UnregisterInput(
                            address=input.address,
                            registrationId=input.registrationId,
                            graceSeconds=input.graceSeconds,
                            host=host,
                        ),
                        result_type=bool,
                        start_to_close_timeout=timedelta(seconds=60 + input.graceSeconds),
                        retry_policy=CLEANUP_RETRY,
                        summary=summaries.summary(f"unregister on {input.hostId or input.address}"),
                    )
                unregistered = True
            except ActivityError as err:
                # The host stayed unreachable through every retry: its function processes die
                # with it (parent-death signal), so the slot is released all the same.
                workflow.logger.warning("cleanup could not reach the host: %s", failure_text(err))
        released = True
        try:
            await workflow.get_external_workflow_handle(pool_workflow_id(input.runtime)).signal(
                SIGNAL_RELEASE, ReleaseSignal(runUid=input.runUid)
            )
        except Exception:
            released = False
        return CleanupResult(unregistered=unregistered, released=released)
