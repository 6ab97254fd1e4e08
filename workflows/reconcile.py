"""ReconcileWorkflow (reconcile/{runtime}): the orphan collection of one runtime.

A round (the `reconcile` activity) reads what the runtime's pool, hosts, provider and disk hold,
lets kruntimes.decisions.reconciling decide what is orphaned (registrations of Runs that are gone,
reservations of Runs terminated out of band, hosts the pool does not know, workspaces nobody
holds, Ready Runs whose registration vanished, hosts whose HostWorkflow is gone) and repairs it,
leaving alone whatever is younger than the grace period (being created right now).

Rounds run every intervalSeconds, at every worker start (its `reconcile` signal), and when an
operator asks: the `collect` Update runs a round that starts after it arrived and answers with
its report (`krt hosts reconcile`), so the request and what it did are in this history.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from kruntimes.contracts.names import QUERY_RECONCILE, SIGNAL_RECONCILE, UPDATE_COLLECT
    from kruntimes.contracts.reconcile import ReconcileInput, ReconcileReport
    from kruntimes.decisions.reconciling import next_round_in
    from kruntimes.wire import summaries
    from kruntimes.workflows.common import failure_text

ROUND_TIMEOUT = timedelta(minutes=5)
ROUND_HEARTBEAT = timedelta(seconds=30)
ROUND_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=2)
MAX_ROUNDS = 200  # per run; then continue-as-new


@workflow.defn(name="ReconcileWorkflow")
class ReconcileWorkflow:
    def __init__(self) -> None:
        self._asked = 0  # requests for a round (signals and Updates)
        self._covered = 0  # requests that a finished round started after
        self._last: ReconcileReport | None = None

    @workflow.signal(name=SIGNAL_RECONCILE)
    def reconcile(self) -> None:
        self._asked += 1

    @workflow.update(name=UPDATE_COLLECT)
    async def collect(self) -> ReconcileReport:
        """Run a round now; its report once it is done."""
        self._asked += 1
        wanted = self._asked
        await workflow.wait_condition(lambda: self._covered >= wanted and self._last is not None)
        assert self._last is not None
        return self._last

    @workflow.query(name=QUERY_RECONCILE)
    def last(self) -> ReconcileReport | None:
        return self._last

    @workflow.run
    async def run(self, input: ReconcileInput) -> None:
        self._last = input.last
        for _ in range(MAX_ROUNDS):
            asked = self._asked
            began = workflow.now()
            self._last = await self._round(input)
            self._covered = asked
            if self._asked > self._covered:
                continue  # asked while the round ran: another one, from now
            # Paced: a round that read many Runs waits longer for the next (decisions.reconciling.PACE).
            wait = next_round_in(input.intervalSeconds, (workflow.now() - began).total_seconds())
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._asked > self._covered,
                    timeout=wait,
                    timeout_summary=summaries.summary(
                        f"next round in {wait:g} s" if wait is not None else "next round when asked"
                    ),
                )
            if workflow.info().is_continue_as_new_suggested():
                break
        while True:  # nobody waits for a round across continue-as-new
            while self._asked > self._covered:
                asked = self._asked
                self._last = await self._round(input)
                self._covered = asked
            await workflow.wait_condition(
                lambda: self._asked > self._covered or workflow.all_handlers_finished()
            )
            if self._asked == self._covered:
                break
        workflow.continue_as_new(input._replace(last=self._last))

    async def _round(self, input: ReconcileInput) -> ReconcileReport:
        try:
            report: ReconcileReport = await workflow.execute_activity(
                "reconcile",
                input._replace(last=None),
                result_type=ReconcileReport,
                start_to_close_timeout=ROUND_TIMEOUT,
                heartbeat_timeout=ROUND_HEARTBEAT,
                retry_policy=ROUND_RETRY,
                summary=summaries.summary(f"reconcile {input.runtime}"),
            )
        except ActivityError as err:
            return ReconcileReport(runtime=input.runtime, at=workflow.now(), errors=[failure_text(err)])
        if report.actions:
            workflow.logger.info("reconciled %s: %d action(s)", input.runtime, report.actions)
        return report
