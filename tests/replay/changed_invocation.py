"""Variants of InvocationWorkflow for the replay tests: one that attempts without reading its
target first (replaying a recorded history against it must fail), one that only delegates (it
must replay: the control). Its own module (no pytest import): the sandbox re-imports it."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from kruntimes.contracts.invocation import (
        INVOCATION_WORKFLOW,
        InvocationInput,
        InvocationPolicy,
        InvocationStatus,
        Target,
    )
    from kruntimes.workflows.invocation import InvocationWorkflow


@workflow.defn(name=INVOCATION_WORKFLOW)
class AttemptsBlind(InvocationWorkflow):
    @workflow.init
    def __init__(self, input: InvocationInput) -> None:
        super().__init__(input)

    @workflow.run
    async def run(self, input: InvocationInput) -> InvocationStatus:
        return await super().run(input)

    async def _read_target(self, target: Target) -> InvocationPolicy | None:
        return InvocationPolicy(exists=True, ready=True)


@workflow.defn(name=INVOCATION_WORKFLOW)
class UnchangedInvocation(InvocationWorkflow):
    @workflow.init
    def __init__(self, input: InvocationInput) -> None:
        super().__init__(input)

    @workflow.run
    async def run(self, input: InvocationInput) -> InvocationStatus:
        return await super().run(input)
