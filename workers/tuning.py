"""The worker's tuning: the Temporal Worker options every kruntimes worker uses, and their bounds.

What each setting was measured to change is in docs/measurements.md and docs/pool.md ("The
worker's memory"); here each says why it is set.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.worker import PollerBehaviorAutoscaling, UnsandboxedWorkflowRunner, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

# A task queue's name, as the worker's flags take it.
MAX_TASK_QUEUE_LENGTH = 200

# Workflows the Runs' worker keeps in memory between their tasks (Temporal's sticky cache): enough
# for a burst's Runs in flight and the HostWorkflows; an idle Ready Run needs none of it, its next
# task replays its short history instead.
DEFAULT_WORKFLOW_CACHE = 256
MAX_WORKFLOW_CACHE = 100_000

# A workflow's next task goes to the worker that ran its last one, and to any worker only after
# this long without being picked up: the pools and Runs of a worker that died wait this long for
# another (a live worker picks a sticky task up within milliseconds).
STICKY_TIMEOUT = timedelta(seconds=3)

# A pool's workflow task that a dying worker had started goes to another worker after this long:
# every admission waits for it (its tasks take milliseconds; one with a long local activity is
# kept alive by the SDK's task heartbeats).
POOL_TASK_TIMEOUT = timedelta(seconds=4)


def workflow_runner(sandboxed: bool) -> WorkflowRunner:
    """How the worker runs workflow code: without the SDK's sandbox unless asked (`--sandbox`).

    The sandbox re-imports a workflow's module for every workflow run and enters itself again for
    every payload it serializes, a large part of the worker's CPU and of a warm Run's start. Its
    protection is kept where it catches mistakes before they ship: the replay tests run every
    recorded history of every workflow type through the SDK's sandboxed runner (with its default
    restrictions), so a non-deterministic call in workflow code fails CI. `krt worker --sandbox`
    runs the sandbox in production too, for development.
    """
    return SandboxedWorkflowRunner() if sandboxed else UnsandboxedWorkflowRunner()


def worker_tuning(sandboxed: bool) -> dict[str, Any]:
    """The Worker options every kruntimes worker uses (the lifecycle bench's floor too).

    Workflow-task pollers scale with the backlog (the server says how much waits): with a fixed
    number, one poll takes the task queue a new workflow's first task comes on (the rest poll
    its sticky queue), and a burst of new Runs waits for that one poll."""
    return {
        "workflow_runner": workflow_runner(sandboxed),
        "sticky_queue_schedule_to_start_timeout": STICKY_TIMEOUT,
        "workflow_task_poller_behavior": PollerBehaviorAutoscaling(),
    }
