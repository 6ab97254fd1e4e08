"""Variants of RuntimePoolWorkflow for the replay tests of admission control and of tenant groups:
each changes what the pool commands on one recorded path (replaying that path's history against it
must fail), and one only delegates (it must replay every pool history: the control).

Its own module (no pytest import) because the workflow sandbox re-imports a workflow's module.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from kruntimes.contracts.pool import PoolInput, QueueActionInput, QueueActionResult
    from kruntimes.decisions.scheduling.model import TenantPolicy
    from kruntimes.workflows.pool import RuntimePoolWorkflow, _Outbox


@workflow.defn(name="RuntimePoolWorkflow")
class UnchangedPool(RuntimePoolWorkflow):
    """The same workflow through the same subclassing: what the changed variants differ from."""

    @workflow.run
    async def run(self, input: PoolInput) -> None:
        await super().run(input)


@workflow.defn(name="RuntimePoolWorkflow")
class TimerInPause(RuntimePoolWorkflow):
    """The pause Update starts a timer before it applies: a command its history never saw."""

    @workflow.run
    async def run(self, input: PoolInput) -> None:
        await super().run(input)

    @workflow.update(name="pause_queue")
    async def pause_queue(self, request: QueueActionInput) -> QueueActionResult:
        await workflow.sleep(0.001)
        return await super().pause_queue(request)


@workflow.defn(name="RuntimePoolWorkflow")
class DrainUnheard(RuntimePoolWorkflow):
    """The drain Update does not wake the loop: its rejections wait for the pool's next message."""

    @workflow.run
    async def run(self, input: PoolInput) -> None:
        await super().run(input)

    @workflow.update(name="drain_queue")
    async def drain_queue(self, request: QueueActionInput) -> QueueActionResult:
        result = await super().drain_queue(request)
        self._wake = False
        return result


@workflow.defn(name="RuntimePoolWorkflow")
class ResumeDecidesNothing(RuntimePoolWorkflow):
    """Resume lifts the pause without deciding the queue again: no scale-out for what waits."""

    @workflow.run
    async def run(self, input: PoolInput) -> None:
        await super().run(input)

    @workflow.update(name="resume_queue")
    async def resume_queue(self, request: QueueActionInput) -> QueueActionResult:
        result = await super().resume_queue(request)
        self._update(admission=self.state.admission.model_copy(update={"decideAgain": False}))
        return result


@workflow.defn(name="RuntimePoolWorkflow")
class Groupless(RuntimePoolWorkflow):
    """A tenant's policy without its group: the group's hosts and scale-outs are not the tenant's."""

    @workflow.run
    async def run(self, input: PoolInput) -> None:
        await super().run(input)

    def _policy(self, tenant: str | None) -> TenantPolicy | None:
        policy = super()._policy(tenant)
        return None if policy is None else policy.model_copy(update={"group": None})


@workflow.defn(name="RuntimePoolWorkflow")
class UncoveredPastMaxHosts(RuntimePoolWorkflow):
    """The Runs decided again after a host is Ready are decided with one host more than maxHosts."""

    @workflow.run
    async def run(self, input: PoolInput) -> None:
        await super().run(input)

    def _readmit_uncovered(self, outbox: _Outbox) -> None:
        config = self.config
        runtime = config.runtime.model_copy(update={"maxHosts": config.runtime.maxHosts + 1})
        self.config = config.model_copy(update={"runtime": runtime})
        try:
            super()._readmit_uncovered(outbox)
        finally:
            self.config = config


@workflow.defn(name="RuntimePoolWorkflow")
class FifoQueue(RuntimePoolWorkflow):
    """The queue placed first come, first served although the history asked for pool-fair-queue:
    a freed slot goes to the backlog, not to the other tenant's Run."""

    @workflow.run
    async def run(self, input: PoolInput) -> None:
        await super().run(input)

    def _place_queued(self, outbox: _Outbox) -> None:
        self._fair = False
        super()._place_queued(outbox)
