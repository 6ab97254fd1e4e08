"""A stand-in HostWorkflow for the time-skipping tests: it watches nothing (a watch would run in
real time while hours are skipped) and, told to delete its host, tells the pool the host is gone.

Its own module (no pytest import) because the workflow sandbox re-imports a workflow's module.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from kruntimes.contracts.host import HostInput
    from kruntimes.contracts.names import SIGNAL_HOST_COMMAND, SIGNAL_HOST_LOST
    from kruntimes.contracts.run import HostCommand, HostLostSignal


@workflow.defn(name="HostWorkflow")
class StandInHostWorkflow:
    def __init__(self) -> None:
        self._delete: HostCommand | None = None

    @workflow.signal(name=SIGNAL_HOST_COMMAND)
    def command(self, command: HostCommand) -> None:
        if command.action == "delete":
            self._delete = command

    @workflow.run
    async def run(self, input: HostInput) -> None:
        await workflow.wait_condition(lambda: self._delete is not None)
        assert self._delete is not None
        lost = HostLostSignal(
            hostId=input.host.hostId, hostUid=input.host.hostUid, reason=self._delete.reason, fenced=True
        )
        await workflow.get_external_workflow_handle(input.poolWorkflowId).signal(SIGNAL_HOST_LOST, lost)
