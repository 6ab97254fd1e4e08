"""The Temporal worker: `krt worker` or `python -m kruntimes.workers.worker`.

Registers every workflow and activity, reads the platform config once, makes sure each runtime's
pool workflow runs with the current config, and exposes the SDK's metrics for Prometheus.

Its platform credentials (`WorkerTrust`): the control-plane certificate every channel to a host
presents, the key it signs assignments with (only activities hold it), and optionally the platform
CA, with which the process provider issues the hosts it starts their certificates and renews them;
the CA directory is read again when it changes (a CA rotation's new bundle, then its new key), and
a host certificate not of the CA's current key and bundle is re-issued at the next renewal check.

When a runtime's hosts are pods (`provider: kubernetes`), the worker reaches the API server from
a kubeconfig (`--kubeconfig`, `--kube-context`) or, inside a cluster, its service account; it
checks every pod template against the Kubernetes schema and that it may list pods in each
runtime's namespace before it serves anything, and watches the host pods of its control plane
(`--control-plane-id`) so that a lost pod makes its pool probe its hosts at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.worker import PollerBehaviorAutoscaling, UnsandboxedWorkflowRunner, Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from kruntimes.activities.handoff import HandoffActivities, Mailbox, Register, watch_pool_pollers
from kruntimes.activities.host_manager import HostActivities, ProbeActivities
from kruntimes.activities.host_watch import HostWatchActivities, signal_ready_with, signal_run_with
from kruntimes.activities.hosts import ProcessProvider, default_manager
from kruntimes.activities.hosts import kubernetes as kube
from kruntimes.activities.hosts._rpc import use_peer_tls
from kruntimes.activities.hosts.events import HostEvent, HostWorkflowRoute, WorkflowSignals
from kruntimes.activities.hosts.kubernetes_pods import check_control_plane_id
from kruntimes.activities.hosts.kubernetes_watch import PodWatch
from kruntimes.activities.reconcile import ReconcileActivities
from kruntimes.activities.retention import RetentionActivities
from kruntimes.activities.runtime_host import RuntimeHostActivities
from kruntimes.activities.signals import SignalActivities
from kruntimes.cli.main import leave
from kruntimes.config.platform import PlatformConfig, load_config
from kruntimes.contracts.names import (
    POOL_TASK_QUEUE,
    SIGNAL_CONFIGURE,
    SIGNAL_RECONCILE,
    TASK_QUEUE,
    pool_workflow_id,
    reconcile_workflow_id,
)
from kruntimes.contracts.platform import PlatformInfo
from kruntimes.contracts.pool import PoolConfig, PoolInput
from kruntimes.contracts.providers import HostDefaults
from kruntimes.contracts.reconcile import ReconcileInput
from kruntimes.decisions.scheduling.failures import ProviderError
from kruntimes.pki import (
    DEFAULT_LIFETIME,
    AuthorityError,
    AuthorityWatch,
    HostIssuer,
    PeerTLS,
    PeerTLSError,
    Role,
)
from kruntimes.pki.assignments import AssignmentError, Signer
from kruntimes.pki.authority import check_lifetime
from kruntimes.system import logs, malloc
from kruntimes.system.serving import stop_event
from kruntimes.temporal import connect as temporal
from kruntimes.temporal.connect import TemporalSettings
from kruntimes.temporal.known_runs import KnownRuns
from kruntimes.wire import summaries
from kruntimes.workflows.cleanup import CleanupWorkflow
from kruntimes.workflows.host import HostWorkflow
from kruntimes.workflows.pool import RuntimePoolWorkflow
from kruntimes.workflows.reconcile import ReconcileWorkflow
from kruntimes.workflows.retention import RetentionWorkflow
from kruntimes.workflows.run import RunWorkflow
from kruntimes.workflows.scaleout import ScaleOutWorkflow
from kruntimes.workflows.scheduled import ScheduledRunWorkflow

log = logging.getLogger(__name__)

MAX_TASK_QUEUE_LENGTH = 200
RUN_WORKFLOWS = [
    RunWorkflow,
    ScaleOutWorkflow,
    CleanupWorkflow,
    HostWorkflow,
    ReconcileWorkflow,
    RetentionWorkflow,
    ScheduledRunWorkflow,
]
POOL_WORKFLOWS = [RuntimePoolWorkflow]
# Workflows the Runs' worker keeps in memory between their tasks (Temporal's sticky cache; the
# SDK's default is 1,000). A cached workflow costs the worker ~110 KB (its instance, its state and
# the activation it started from); an idle Ready Run needs none of it: its next task (a cancel,
# its idle timer) replays its short history instead. 256 holds a burst's Runs in flight and the
# HostWorkflows; bench/scale.py at 10,000 Ready Runs: worker RSS at N/2 and N 336-357 and
# 367-410 MB with 1,000, 246 and 280 MB with 256, and no slower (10,000 Ready in 270 s, 305 s).
DEFAULT_WORKFLOW_CACHE = 256
MAX_WORKFLOW_CACHE = 100_000


@dataclass(frozen=True)
class WorkerTrust:
    """The worker's platform credentials (see the module docstring)."""

    peer_tls: Path  # its certificate directory: a control-plane identity of the platform CA
    assignment_key: Path  # the Ed25519 private key assignments are signed with
    platform_ca: Path | None = None  # ca.crt, ca.key, bundle.crt; None: the process provider starts no host
    host_certificate_lifetime: timedelta = DEFAULT_LIFETIME


@dataclass(frozen=True)
class WorkerSettings:
    temporal: TemporalSettings
    config: PlatformConfig
    platform: PlatformInfo
    trust: WorkerTrust
    metrics_address: str | None = None
    probe_interval_s: float | None = 60.0
    sandboxed: bool = False  # see workflow_runner
    workflow_cache: int = DEFAULT_WORKFLOW_CACHE  # the Runs' worker's; the pools' keeps the SDK's
    # The task queues this process serves: the Runs' (RunWorkflow, ScaleOut, Cleanup and their
    # activities) and/or the pools'.
    queues: frozenset[str] = frozenset({"runs", "pools"})
    # Their names: a test or a second platform on the same Temporal namespace picks its own.
    run_task_queue: str = TASK_QUEUE
    pool_task_queue: str = POOL_TASK_QUEUE
    # What hosts are told about isolation: the default for runtimes that name none, where
    # `source.path` may point, what functions never see (the state directory is always added).
    host_defaults: HostDefaults = field(default_factory=HostDefaults)
    # How to reach the Kubernetes API for `provider: kubernetes` runtimes (None: the defaults:
    # in a cluster its service account, else the default kubeconfig).
    kubernetes: kube.KubernetesAccess | None = None
    # The owner annotated on this control plane's host pods (default: Temporal namespace and pool
    # task queue); two control planes sharing a Kubernetes namespace need different ones.
    control_plane_id: str | None = None

    @property
    def control_plane(self) -> str:
        return self.control_plane_id or f"{self.temporal.namespace}/{self.pool_task_queue}"


def _host_defaults(settings: WorkerSettings) -> HostDefaults:
    defaults = settings.host_defaults
    roots = settings.config.allowedSourceRoots
    hide = sorted({*defaults.hide, *([settings.platform.stateDir] if settings.platform.stateDir else [])})
    return defaults.model_copy(
        update={
            "allowedSourceRoots": defaults.allowedSourceRoots if roots is None else roots,
            "hide": hide,
            "shared": sorted({*defaults.shared, *settings.config.sharedDirectories}),
        }
    )


def workflow_runner(sandboxed: bool) -> WorkflowRunner:
    """How the worker runs workflow code: without the SDK's sandbox unless asked (`--sandbox`).

    The sandbox re-imports a workflow's module for every workflow run and enters itself again for
    every payload it serializes; measured here that was about a third of the worker's CPU and
    30% of a warm Run's create→Ready. Its protection is kept where it catches mistakes before they
    ship: the replay tests run every recorded history of every workflow type through the SDK's
    sandboxed runner (with its default restrictions), so a non-deterministic call in workflow code
    fails CI. `krt worker --sandbox` runs the sandbox in production too, for development.
    """
    return SandboxedWorkflowRunner() if sandboxed else UnsandboxedWorkflowRunner()


# A workflow's next task goes to the worker that ran its last one (its sticky queue), and to any
# worker only after this long without being picked up: after a worker dies (it is started again
# within seconds), the pools and Runs it ran wait this long, not the SDK's default 10 s. A live
# worker picks a sticky task up within milliseconds.
STICKY_TIMEOUT = timedelta(seconds=3)


# A pool's workflow task that a dying worker had started is given to another one after this long
# (the server's default is 10 s): every admission waits for it. Its tasks take milliseconds; one
# with a long local activity is kept alive by the SDK's task heartbeats.
POOL_TASK_TIMEOUT = timedelta(seconds=4)


def worker_tuning(sandboxed: bool) -> dict[str, Any]:
    """The Worker options every kruntimes worker uses (the lifecycle bench's floor too).

    Workflow-task pollers scale with the backlog (the server says how much waits): by default a
    worker keeps 5 polls open, of which one polls the task queue a new workflow's first task
    comes on (the rest poll its sticky queue), and a burst of new Runs waited for that one poll
    (bench/lifecycle.py, same loaded machine: the 300-Run burst 22.9-24.7 -> 29.0 Runs/s, the
    plain-workflow floor 42-43 -> 50.8/s)."""
    return {
        "workflow_runner": workflow_runner(sandboxed),
        "sticky_queue_schedule_to_start_timeout": STICKY_TIMEOUT,
        "workflow_task_poller_behavior": PollerBehaviorAutoscaling(),
    }


def pool_configs(settings: WorkerSettings, *, providers: list[str]) -> dict[str, PoolConfig]:
    """The configuration of each runtime's pool, as this worker gives it."""
    return {
        runtime.name: PoolConfig(
            runtime=runtime,
            tenants=settings.config.tenants,
            queueLimit=settings.config.queueLimit,
            platform=settings.platform,
            providers=providers,
            probeIntervalSeconds=settings.probe_interval_s,
            runTaskQueue=settings.run_task_queue,
            hostDefaults=_host_defaults(settings),
        )
        for runtime in settings.config.runtimes
    }


async def ensure_pools(client: Client, settings: WorkerSettings, *, providers: list[str]) -> None:
    """Start each runtime's pool, or give a running one the current config (signal-with-start)."""
    for runtime_name, config in pool_configs(settings, providers=providers).items():
        runtime = config.runtime
        assert runtime.name == runtime_name
        await client.start_workflow(
            RuntimePoolWorkflow.run,
            PoolInput(config=config),
            id=pool_workflow_id(runtime.name),
            task_queue=settings.pool_task_queue,
            task_timeout=POOL_TASK_TIMEOUT,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            start_signal=SIGNAL_CONFIGURE,
            start_signal_args=[config],
            static_summary=summaries.summary(
                f"pool {runtime.name} ({runtime.provider}, up to {runtime.maxHosts} hosts)"
            ),
        )
        # The runtime's reconciler, asked for a round at once: orphans are collected at every
        # worker start, and periodically.
        reconcile = ReconcileInput(
            runtime=runtime.name,
            poolWorkflowId=pool_workflow_id(runtime.name),
            stateDir=settings.platform.stateDir,
            runTaskQueue=settings.run_task_queue,
            intervalSeconds=settings.config.reconcileIntervalSeconds,
            graceSeconds=2 * runtime.assignmentTimeoutSeconds,
            watchIntervalSeconds=settings.platform.heartbeatIntervalSeconds,
            assignmentTimeoutSeconds=runtime.assignmentTimeoutSeconds,
        )
        await client.start_workflow(
            ReconcileWorkflow.run,
            reconcile,
            id=reconcile_workflow_id(runtime.name),
            task_queue=settings.run_task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            start_signal=SIGNAL_RECONCILE,
            start_signal_args=[reconcile],  # a running reconciler takes the current config
            static_summary=summaries.summary(
                f"reconcile {runtime.name} every {reconcile.intervalSeconds:g} s or more (paced)"
                if reconcile.intervalSeconds is not None
                else f"reconcile {runtime.name} when asked"
            ),
        )


class TrustError(Exception):
    """The worker's platform credentials cannot be used."""


def load_trust(trust: WorkerTrust) -> tuple[PeerTLS, Signer, HostIssuer | None]:
    try:
        peer_tls = PeerTLS(trust.peer_tls, role=Role.CONTROL_PLANE)
        signer = Signer.load(trust.assignment_key)
        check_lifetime(trust.host_certificate_lifetime)
        issuer = None
        if trust.platform_ca is not None:
            issuer = HostIssuer(
                AuthorityWatch(trust.platform_ca), signer.public_pem, trust.host_certificate_lifetime
            )
    except (PeerTLSError, AssignmentError, AuthorityError, ValueError) as e:
        raise TrustError(str(e)) from e
    return peer_tls, signer, issuer


async def renew_host_certificates(provider: ProcessProvider, *, every_s: float) -> None:
    """Re-issue the certificates of the provider's hosts as they come due, until cancelled."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await asyncio.to_thread(provider.renew_certificates)
        except OSError:
            log.warning("renewing host certificates failed", exc_info=True)


async def renew_pod_certificates(provider: kube.KubernetesProvider, *, every_s: float) -> None:
    """Re-issue the certificate Secrets of the provider's host pods as they come due, until
    cancelled."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await provider.renew_certificates()
        except ProviderError:
            log.warning("renewing host pod certificates failed", exc_info=True)


@contextlib.asynccontextmanager
async def kubernetes_hosts(
    client: Client, settings: WorkerSettings, *, issuer: HostIssuer | None
) -> AsyncIterator[kube.KubernetesProvider | None]:
    """The kubernetes provider and its pod watches, when a runtime uses it; else None. An event
    that may mean a lost pod goes to that host's HostWorkflow as a provider report.

    Raises KubernetesConfigError (before anything is served) when the API cannot be used.
    """
    runtimes = kube.runtimes_of(settings.config)
    if not runtimes:
        yield None
        return
    kube.validate_templates(runtimes, control_plane=settings.control_plane)
    access = settings.kubernetes or kube.KubernetesAccess(in_cluster=kube.in_cluster())
    api_client = await kube.connect(access)
    try:
        await kube.check_access(api_client, {r.namespace for r in runtimes.values()})
        provider = kube.KubernetesProvider(
            api_client, runtimes=runtimes, control_plane=settings.control_plane, issuer=issuer
        )
        signals = WorkflowSignals(client, HostWorkflowRoute())

        def on_event(event: HostEvent) -> None:
            signals(event)

        watches = [
            PodWatch(
                api_client,
                namespace=namespace,
                control_plane=settings.control_plane,
                on_event=on_event,
                on_pod=provider.notify,
                provider=provider.name,
            )
            for namespace in sorted(provider.namespaces)
        ]
        tasks = [asyncio.create_task(w.run()) for w in watches] + [asyncio.create_task(signals.run())]
        if issuer is not None:
            every_s = min(3600.0, issuer.lifetime.total_seconds() / 30)
            tasks.append(asyncio.create_task(renew_pod_certificates(provider, every_s=every_s)))
        try:
            yield provider
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await api_client.close()


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
    test runs an earlier RunWorkflow to start Runs the current one takes over);
    `handoff_register`: given the registration the in-process handoff makes, what it makes
    instead (bench/lifecycle.py --host-work measures a burst without the hosts' work)."""
    peer_tls, signer, issuer = load_trust(settings.trust)
    use_peer_tls(peer_tls)
    async with (
        kubernetes_hosts(client, settings, issuer=issuer) as kubernetes,
        _running_workers(
            client,
            settings,
            kubernetes,
            signer=signer,
            issuer=issuer,
            run_workflows=run_workflows,
            handoff_register=handoff_register,
        ) as workers,
    ):
        yield workers


@contextlib.asynccontextmanager
async def _running_workers(
    client: Client,
    settings: WorkerSettings,
    kubernetes: kube.KubernetesProvider | None,
    *,
    signer: Signer,
    issuer: HostIssuer | None,
    run_workflows: Sequence[type],
    handoff_register: Callable[[Register], Register] | None,
) -> AsyncIterator[RunningWorkers]:
    gateways = list(settings.platform.gatewayHeartbeats) or None  # the current ones, for the hosts
    host_manager = default_manager(
        state_dir=settings.platform.stateDir or None, issuer=issuer, kubernetes=kubernetes
    )
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
    process = host_manager.provider("process")
    if issuer is not None and isinstance(process, ProcessProvider):
        every_s = min(60.0, issuer.lifetime.total_seconds() / 30)
        tasks.append(asyncio.create_task(renew_host_certificates(process, every_s=every_s)))
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="krt worker", description="Run the kruntimes Temporal worker.")
    temporal.add_arguments(parser)
    parser.add_argument(
        "--config", type=Path, help="platform config YAML (default: python and bash runtimes)"
    )
    parser.add_argument("--state-dir", type=Path, required=True, help="where process hosts live")
    parser.add_argument("--gateway-url", default="https://127.0.0.1:8443")
    parser.add_argument("--ca-file", type=Path, help="the gateway CA (PEM) put into Run endpoints")
    parser.add_argument(
        "--gateway-heartbeat",
        action="append",
        default=[],
        help="a gateway's heartbeat address hosts report to",
    )
    parser.add_argument("--heartbeat-interval", type=float, default=5.0)
    parser.add_argument(
        "--peer-tls",
        type=Path,
        required=True,
        help="the worker's platform certificate directory (tls.crt, tls.key, ca.crt; a control-plane "
        "identity) presented to hosts; reloaded on change",
    )
    parser.add_argument(
        "--assignment-key",
        type=Path,
        required=True,
        help="the Ed25519 private key (PEM, 0600) assignments are signed with",
    )
    parser.add_argument(
        "--platform-ca",
        type=Path,
        help="a directory with the platform CA (ca.crt, ca.key, and bundle.crt: the CAs hosts trust; "
        "loaded again when they change): the worker issues the hosts it starts their certificates "
        "(without it, it starts none)",
    )
    parser.add_argument(
        "--host-certificate-lifetime",
        type=float,
        default=DEFAULT_LIFETIME.total_seconds(),
        help="seconds a host certificate is valid (renewed after two thirds); default 30 days",
    )
    parser.add_argument("--metrics-address", help="host:port for Prometheus metrics, e.g. 127.0.0.1:9464")
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--queues",
        default="runs,pools",
        help="the task queues to serve: runs, pools or both (default runs,pools)",
    )
    parser.add_argument(
        "--task-queue",
        default=TASK_QUEUE,
        help=f"the Runs' task queue (default {TASK_QUEUE}); starters must use the same",
    )
    parser.add_argument(
        "--pool-task-queue",
        default=POOL_TASK_QUEUE,
        help=f"the pools' task queue (default {POOL_TASK_QUEUE})",
    )
    parser.add_argument(
        "--isolation",
        choices=["uid", "same-user"],
        default="uid",
        help="how hosts isolate functions when a runtime names nothing: uid (each function its own "
        "unprivileged uid; hosts that cannot switch uids refuse to start) or same-user",
    )
    parser.add_argument(
        "--allowed-source-root",
        action="append",
        default=[],
        metavar="DIR",
        help="a directory Runs' source.path may point into (repeatable; the runtimes file's "
        "allowedSourceRoots replaces them); none: only inline sources",
    )
    parser.add_argument(
        "--kubeconfig",
        help="kubeconfig file for provider: kubernetes (default: in a cluster its service account, "
        "else $KUBECONFIG or ~/.kube/config)",
    )
    parser.add_argument("--kube-context", help="the kubeconfig context to use (default: its current one)")
    parser.add_argument(
        "--control-plane-id",
        help="the owner annotated on this control plane's host pods "
        "(default: <temporal namespace>/<pool task queue>)",
    )
    parser.add_argument(
        "--workflow-cache",
        type=int,
        default=DEFAULT_WORKFLOW_CACHE,
        metavar="N",
        help=f"workflows of the Runs' task queue kept in memory between their tasks (default "
        f"{DEFAULT_WORKFLOW_CACHE}; 0 keeps none: every task replays its workflow's history)",
    )
    parser.add_argument(
        "--sandbox",
        action="store_true",
        help="run workflow code in the Temporal SDK's sandbox (slower; for developing workflows)",
    )
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> WorkerSettings:
    ca = args.ca_file.read_text() if args.ca_file else None
    settings = WorkerSettings(
        temporal=temporal.settings_from(args),
        config=load_config(args.config),
        platform=PlatformInfo(
            gatewayUrl=args.gateway_url,
            caBundle=ca,
            stateDir=str(args.state_dir.resolve()),
            gatewayHeartbeats=args.gateway_heartbeat,
            heartbeatIntervalSeconds=args.heartbeat_interval,
        ),
        trust=WorkerTrust(
            peer_tls=args.peer_tls,
            assignment_key=args.assignment_key,
            platform_ca=args.platform_ca,
            host_certificate_lifetime=timedelta(seconds=args.host_certificate_lifetime),
        ),
        metrics_address=args.metrics_address,
        sandboxed=args.sandbox,
        workflow_cache=_workflow_cache(args.workflow_cache),
        queues=_queues(args.queues),
        run_task_queue=_task_queue(args.task_queue, flag="--task-queue"),
        pool_task_queue=_task_queue(args.pool_task_queue, flag="--pool-task-queue"),
        host_defaults=HostDefaults(
            isolation=args.isolation,
            allowedSourceRoots=[str(Path(r).expanduser().resolve()) for r in args.allowed_source_root],
        ),
        kubernetes=_kubernetes_access(args),
        control_plane_id=args.control_plane_id,
    )
    try:
        check_control_plane_id(settings.control_plane)
        runtimes = kube.runtimes_of(settings.config)
        kube.validate_templates(runtimes, control_plane=settings.control_plane)
        kube.check_certificates(runtimes, can_issue=settings.trust.platform_ca is not None)
    except (ValueError, kube.KubernetesConfigError) as e:
        raise SystemExit(f"krt worker: {e}") from e
    if settings.run_task_queue == settings.pool_task_queue:
        # Each queue's worker registers only its own workflows: a shared queue would hand pool
        # tasks to the Runs' worker and the other way round.
        raise SystemExit("krt worker: --task-queue and --pool-task-queue must differ")
    return settings


def _kubernetes_access(args: argparse.Namespace) -> kube.KubernetesAccess | None:
    if args.kubeconfig is None and args.kube_context is None:
        return None
    return kube.KubernetesAccess(kubeconfig=args.kubeconfig, context=args.kube_context)


def _queues(text: str) -> frozenset[str]:
    queues = frozenset(q.strip() for q in text.split(",") if q.strip())
    unknown = queues - {"runs", "pools"}
    if not queues or unknown:
        raise SystemExit(f"krt worker: --queues takes runs, pools or both, not {text!r}")
    return queues


def _workflow_cache(count: int) -> int:
    if not 0 <= count <= MAX_WORKFLOW_CACHE:
        raise SystemExit(f"krt worker: --workflow-cache takes 0 to {MAX_WORKFLOW_CACHE:,}, not {count}")
    return count


def _task_queue(text: str, *, flag: str) -> str:
    name = text.strip()
    if not name or len(name) > MAX_TASK_QUEUE_LENGTH:
        raise SystemExit(f"krt worker: {flag} takes a name of 1 to {MAX_TASK_QUEUE_LENGTH} characters")
    return name


async def serve(settings: WorkerSettings) -> None:
    runtime = None
    if settings.metrics_address:
        runtime = Runtime(
            telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=settings.metrics_address))
        )
    client = await temporal.connect(settings.temporal, runtime=runtime)
    stop = stop_event()
    # A reconcile lists every Run, a visibility page of 1,000 at a time, through the Temporal
    # core on its own threads: glibc keeps what those pages took in the threads' arenas after
    # they are freed (18 MB of a restarted worker's RSS at 2,000 Runs). The trimmer gives it back
    # (kruntimes.system.malloc; docs/pool.md, "The worker's memory").
    trimmer = malloc.Trimmer()
    trimmer.start()
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(trimmer.stop)
        try:
            running = await stack.enter_async_context(running_workers(client, settings))
        except kube.KubernetesConfigError as e:
            raise SystemExit(f"krt worker: {e}") from e
        log.info(
            "worker running",
            extra={"temporal": settings.temporal.address, "namespace": settings.temporal.namespace},
        )
        ended = await until_stopped(stop, running)
        if ended is not None:
            log.error("a Temporal worker ended; exiting to be started again", extra={"reason": ended})
            raise SystemExit(f"krt worker: {ended}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logs.setup(args.log_level)
    try:
        asyncio.run(serve(settings_from(args)))
    except TrustError as e:
        print(f"krt worker: {e}", file=sys.stderr)
        leave(1)
    except SystemExit as e:  # a configuration the worker cannot run with, already explained
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            leave(1)
        leave(e.code or 0)
    leave(0)


if __name__ == "__main__":
    main()
