"""The worker process put together: its Temporal workers, their workflows and activities, and the
host providers the configuration needs (activities/hosts/registry.py), for `settings.queues`.

Its entry point is workers/worker.py (`krt worker`); tests and benches run `running_workers` in
their own process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from kruntimes.activities.functions import FunctionActivities
from kruntimes.activities.handoff import HandoffActivities, Mailbox, Register, watch_pool_pollers
from kruntimes.activities.host_manager import HostActivities, ProbeActivities
from kruntimes.activities.host_watch import HostWatchActivities, signal_ready_with, signal_run_with
from kruntimes.activities.hosts._rpc import use_peer_tls
from kruntimes.activities.hosts.base import HostManager
from kruntimes.activities.hosts.registry import started_providers
from kruntimes.activities.reconcile import ReconcileActivities
from kruntimes.activities.retention import RetentionActivities
from kruntimes.activities.runtime_host import RuntimeHostActivities
from kruntimes.activities.signals import SignalActivities
from kruntimes.pki.assignments import Signer
from kruntimes.temporal.known_runs import KnownRuns
from kruntimes.workers.pools import ensure_pools
from kruntimes.workers.settings import WorkerSettings, load_trust, provider_setup
from kruntimes.workers.tuning import worker_tuning
from kruntimes.workflows.cleanup import CleanupWorkflow
from kruntimes.workflows.function import FunctionWorkflow
from kruntimes.workflows.host import HostWorkflow
from kruntimes.workflows.pool import RuntimePoolWorkflow
from kruntimes.workflows.reconcile import ReconcileWorkflow
from kruntimes.workflows.retention import RetentionWorkflow
from kruntimes.workflows.run import RunWorkflow
from kruntimes.workflows.scaleout import ScaleOutWorkflow
from kruntimes.workflows.scheduled import ScheduledRunWorkflow

RUN_WORKFLOWS = [
    RunWorkflow,
    ScaleOutWorkflow,
    CleanupWorkflow,
    HostWorkflow,
    ReconcileWorkflow,
    RetentionWorkflow,
    ScheduledRunWorkflow,
    FunctionWorkflow,
]
POOL_WORKFLOWS = [RuntimePoolWorkflow]


class RunningWorkers(list[Worker]):
    """The Temporal workers of a process, and `ended`: done, with what happened, once one of them
    stopped without being asked (its run raised, or returned): the process then serves only part
    of its task queues (Runs would wait for a pool nobody polls), so its entry point exits and its
    supervisor starts it again."""

    def __init__(self, workers: Sequence[Worker], *, known: KnownRuns | None = None) -> None:
        super().__init__(workers)
        self.ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.stopping = False
        self.known = known  # the reconciler's view of which Runs run, kept across its rounds

    def start(self, worker: Worker) -> asyncio.Task[None]:
        """Run `worker`, watched: its end, unless the process is stopping, is `ended`'s answer
        (the error's type only, as every log here: its text is the library's)."""

        def done(task: asyncio.Task[None]) -> None:
            if self.stopping or self.ended.done():
                return
            error = None if task.cancelled() else task.exception()
            what = f"failed ({type(error).__name__})" if error else "stopped"
            self.ended.set_result(f"the worker of task queue {worker.task_queue!r} {what}")

        run = asyncio.create_task(worker.run())
        run.add_done_callback(done)
        return run


async def until_stopped(stop: asyncio.Event, running: RunningWorkers) -> str | None:
    """Wait until the process is asked to stop (None) or one of its workers ended on its own
    (what happened)."""
    asked = asyncio.ensure_future(stop.wait())
    either: list[asyncio.Future[Any]] = [asked, running.ended]
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    finally:
        asked.cancel()
    return running.ended.result() if running.ended.done() else None


@contextlib.asynccontextmanager
async def running_workers(
    client: Client,
    settings: WorkerSettings,
    *,
    run_workflows: Sequence[type] = RUN_WORKFLOWS,
    handoff_register: Callable[[Register], Register] | None = None,
) -> AsyncIterator[RunningWorkers]:
    """The workers of `settings.queues`; `run_workflows`: the Runs' queue's workflow classes (a
    test may run a variant of one);
    `handoff_register`: given the registration the in-process handoff makes, what it makes
    instead (bench/lifecycle.py --host-work measures a burst without the hosts' work)."""
    peer_tls, signer, issuer = load_trust(settings.trust)
    use_peer_tls(peer_tls)
    async with (
        started_providers(provider_setup(settings, issuer=issuer), client=client) as host_manager,
        _running_workers(
            client,
            settings,
            host_manager,
            signer=signer,
            run_workflows=run_workflows,
            handoff_register=handoff_register,
        ) as workers,
    ):
        yield workers


@contextlib.asynccontextmanager
async def _running_workers(
    client: Client,
    settings: WorkerSettings,
    host_manager: HostManager,
    *,
    signer: Signer,
    run_workflows: Sequence[type],
    handoff_register: Callable[[Register], Register] | None,
) -> AsyncIterator[RunningWorkers]:
    gateways = list(settings.platform.gatewayHeartbeats) or None  # the current ones, for the hosts
    manager = HostActivities(host_manager, gateways=gateways)
    hosts = RuntimeHostActivities(signer=signer, gone=manager.gone)
    mailbox = Mailbox()  # the pool's answers to Runs waiting in this process
    signals = SignalActivities(client, mailbox)
    register: Register = hosts.register_function
    if handoff_register is not None:
        register = handoff_register(register)
    handoff = HandoffActivities(mailbox, register=register)
    watch = HostWatchActivities(
        signal_run=signal_run_with(client), signal_ready=signal_ready_with(client), gateways=gateways
    )
    reconciler = ReconcileActivities(client, host_manager)
    activities: list[Callable[..., Any]] = [
        hosts.register_function,
        hosts.function_status,
        hosts.unregister_function,
        hosts.execute_task,
        hosts.cancel_task,
        manager.create_host,
        manager.delete_host,
        manager.fence_host,
        watch.watch_host,
        reconciler.reconcile,
        signals.admit_run,
        handoff.await_assignment,
        RetentionActivities(client).delete_execution,
        FunctionActivities(client).delete_replica,
    ]
    tuning = worker_tuning(settings.sandboxed)
    workers = []
    if "runs" in settings.queues:
        workers.append(
            Worker(
                client,
                task_queue=settings.run_task_queue,
                workflows=list(run_workflows),
                activities=activities,
                max_cached_workflows=settings.workflow_cache,
                **tuning,
            )
        )
    if "pools" in settings.queues:
        workers.append(
            Worker(
                client,
                task_queue=settings.pool_task_queue,
                workflows=POOL_WORKFLOWS,
                activities=[
                    ProbeActivities(host_manager).probe_hosts,
                    signals.signal_runs,
                    signals.host_slots,
                ],
                **tuning,
            )
        )
    running = RunningWorkers(workers, known=reconciler.known)
    tasks = [running.start(w) for w in workers]
    if "pools" in settings.queues:
        tasks.append(
            asyncio.create_task(
                watch_pool_pollers(
                    client,
                    mailbox,
                    client.identity,
                    task_queue=settings.pool_task_queue,
                    run_task_queue=settings.run_task_queue if "runs" in settings.queues else None,
                )
            )
        )
    try:
        if "pools" in settings.queues:
            await ensure_pools(client, settings, providers=list(host_manager.names))
        yield running
    finally:
        running.stopping = True
        for w in workers:
            await w.shutdown()
        for t in tasks[len(workers) :]:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await hosts.close()
