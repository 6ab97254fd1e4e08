"""The worker process put together: its Temporal workers, their workflows and activities, and the
host providers the configuration needs (activities/hosts/registry.py), for `settings.queues`.

Its entry point is workers/worker.py (`krt worker`); tests and benches run `running_workers` in
their own process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
    Worker,
)

from kruntimes.activities.callbacks import CallbackActivities
from kruntimes.activities.function_load import FunctionLoadActivities
from kruntimes.activities.functions import FunctionActivities
from kruntimes.activities.handoff import HandoffActivities, Mailbox, Register, watch_pool_pollers
from kruntimes.activities.host_manager import HostActivities, ProbeActivities
from kruntimes.activities.host_watch import HostWatchActivities, signal_ready_with, signal_run_with
from kruntimes.activities.hosts._rpc import use_peer_tls
from kruntimes.activities.hosts.base import HostManager
from kruntimes.activities.hosts.registry import started_providers
from kruntimes.activities.invocations import InvocationAttempts, InvocationTargets
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
from kruntimes.workflows.invocation import InvocationWorkflow
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
    InvocationWorkflow,
]
POOL_WORKFLOWS = [RuntimePoolWorkflow]

log = logging.getLogger(__name__)

# How long a stopping worker's running activities have before they are cancelled: none, as
# before: each is retried on another worker, and a host's watch (which never ends on its own)
# resumes there from its heartbeat.
SHUTDOWN_GRACE = timedelta(0)
# How long the process waits for its workers to stop before it leaves them (and exits).
SHUTDOWN_BOUND_S = 15.0
# The SDK's own text for the part of a worker that failed (its poller): named in the reason.
_FAILED_PART = {
    "Activity worker failed": "activity poller",
    "Workflow worker failed": "workflow poller",
    "Nexus worker failed": "Nexus poller",
}
# How the SDK's core words the status of a poll that failed: "... Status { code: PermissionDenied, ..."
_STATUS_CODE = re.compile(r"Status \{ code: ([A-Za-z]{1,40}),")


def _failed_part(error: BaseException) -> str:
    return _FAILED_PART.get(str(error), "worker")


def _why(error: BaseException) -> str:
    """The gRPC status code a poll failed with (PermissionDenied, NotFound, ...), else the error's
    type: never the error's text, which may quote the server."""
    code = _STATUS_CODE.search(str(error.__cause__)) if error.__cause__ is not None else None
    return code.group(1) if code else type(error.__cause__ or error).__name__


class RunningActivities(Interceptor):
    """The tasks of the activities a Temporal worker runs. The SDK cancels them at shutdown only
    through the worker's activity poller: once that poller failed (a fatal poll error), nothing
    would cancel them, and a watch that lasts its host's life (watch_host) would keep Worker.run
    from ever returning."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Tracked(next, self.tasks)

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel("the worker's poller failed")


class _Tracked(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, tasks: set[asyncio.Task[Any]]) -> None:
        super().__init__(next)
        self._tasks = tasks

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        task = asyncio.current_task()  # the SDK's task of this activity: what its cancel cancels
        assert task is not None
        self._tasks.add(task)
        try:
            return await super().execute_activity(input)
        finally:
            self._tasks.discard(task)


class RunningWorkers(list[Worker]):
    """The Temporal workers of a process, and `ended`: done, with what happened, once one of them
    stopped without being asked (its run raised, or returned): the process then serves only part
    of its task queues (Runs would wait for a pool nobody polls), so its entry point exits and its
    supervisor starts it again."""

    def __init__(self, workers: Sequence[Worker] = (), *, known: KnownRuns | None = None) -> None:
        super().__init__(workers)
        self.ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.stopping = False
        self.known = known  # the reconciler's view of which Runs run, kept across its rounds

    def guarded(self, task_queue: str) -> dict[str, Any]:
        """The Worker options that end a worker of `task_queue` within a bound when it meets a
        fatal error: `ended` says so at once (the process exits to be started again), and its
        running activities are cancelled after SHUTDOWN_GRACE, so that its run returns."""
        running = RunningActivities()

        async def on_fatal_error(error: BaseException) -> None:
            reason = f"the {_failed_part(error)} of task queue {task_queue!r} failed ({_why(error)})"
            if not self.stopping and not self.ended.done():
                self.ended.set_result(reason)
            asyncio.get_running_loop().call_later(SHUTDOWN_GRACE.total_seconds(), running.cancel)

        return {
            "interceptors": [running],
            "on_fatal_error": on_fatal_error,
            "graceful_shutdown_timeout": SHUTDOWN_GRACE,
        }

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
        signals.admit_run_early,
        handoff.await_assignment,
        RetentionActivities(client).delete_execution,
        FunctionActivities(client).delete_replica,
        FunctionLoadActivities(gateways=settings.platform.gatewayHeartbeats).autoscale_function,
        CallbackActivities.in_state_dir(settings.callbacks, _state_dir(settings)).deliver_callback,
        InvocationTargets(client).invocation_target,
        InvocationAttempts(settings.platform.gatewayHeartbeats).attempt_invocation,
    ]
    tuning = worker_tuning(settings.sandboxed)
    running = RunningWorkers(known=reconciler.known)
    if "runs" in settings.queues:
        running.append(
            Worker(
                client,
                task_queue=settings.run_task_queue,
                workflows=list(run_workflows),
                activities=activities,
                max_cached_workflows=settings.workflow_cache,
                **tuning,
                **running.guarded(settings.run_task_queue),
            )
        )
    if "pools" in settings.queues:
        running.append(
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
                **running.guarded(settings.pool_task_queue),
            )
        )
    workers = list(running)
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
        await _bounded(asyncio.gather(*(w.shutdown() for w in workers)), "stop")
        for t in tasks:
            t.cancel()  # a worker that did not stop in time is left: the process exits anyway
        await _bounded(asyncio.gather(*tasks, return_exceptions=True), "end once cancelled")
        await hosts.close()


def _state_dir(settings: WorkerSettings) -> Path | None:
    return Path(settings.platform.stateDir) if settings.platform.stateDir else None


async def _bounded(stopping: Awaitable[Any], what: str) -> None:
    """Wait at most SHUTDOWN_BOUND_S for `stopping` (the workers' shutdown), then go on without it."""
    waiting = asyncio.ensure_future(stopping)
    done, _ = await asyncio.wait([waiting], timeout=SHUTDOWN_BOUND_S)
    if not done:
        waiting.cancel()
        log.error("the Temporal workers did not %s within %ss; leaving them", what, SHUTDOWN_BOUND_S)
