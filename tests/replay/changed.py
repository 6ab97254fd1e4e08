"""Variants of RunWorkflow for the replay tests: one deliberately incompatible (replaying a recorded
Run history against it must fail), one that only delegates (it must replay: the control).

Its own module (no pytest import) because the workflow sandbox re-imports a workflow's module.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from kruntimes.api.status import RunStatus
    from kruntimes.contracts.run import RunInput
    from kruntimes.workflows.run import RunWorkflow


@workflow.defn(name="RunWorkflow")
class ChangedRunWorkflow(RunWorkflow):
    """Starts a timer before anything else: a command the recorded histories never saw."""

    @workflow.run
    async def run(self, input: RunInput) -> RunStatus:
        await workflow.sleep(1)
        return await super().run(input)


@workflow.defn(name="RunWorkflow")
class UnchangedRunWorkflow(RunWorkflow):
    """The same workflow through the same subclassing: what the changed variant differs from."""

    @workflow.run
    async def run(self, input: RunInput) -> RunStatus:
        return await super().run(input)
