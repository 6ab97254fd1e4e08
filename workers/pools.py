"""Each runtime's pool and reconciler, started (or given the current config) by a worker that
serves the pools' task queue."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy

from kruntimes.contracts.names import (
    SIGNAL_CONFIGURE,
    SIGNAL_RECONCILE,
    pool_workflow_id,
    reconcile_workflow_id,
)
from kruntimes.contracts.pool import PoolConfig, PoolInput
from kruntimes.contracts.reconcile import ReconcileInput
from kruntimes.wire import summaries
from kruntimes.workers.settings import WorkerSettings, host_defaults
from kruntimes.workers.tuning import POOL_TASK_TIMEOUT
from kruntimes.workflows.pool import RuntimePoolWorkflow
from kruntimes.workflows.reconcile import ReconcileWorkflow


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
            hostDefaults=host_defaults(settings),
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
