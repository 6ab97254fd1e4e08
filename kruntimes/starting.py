"""Starting a Run: the workflow start, and beside it the Run's admission to its runtime's pool.

Used by the SDK (and so the CLI) and by the benches. A Run started this way does not ask the
pool itself in its first workflow task: the starter sends the admission right after the start,
so the pool decides while the Run's first task runs, and in a burst the pool's answer is often
already in the Run's history when its first task starts (one workflow task to Ready instead of
two). Should the starter fail between the two calls, the Run asks the pool itself once its
admission grace period is over (workflows/run.py, ADMIT_GRACE); the pool admits a Run at most
once, so a late duplicate changes nothing.

Starting a Run with plain Temporal (RunInput without starterAdmits) stays supported: the Run
then asks the pool from its first task.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.lifecycle import (
    SIGNAL_ADMIT,
    SIGNAL_REJECTED,
    TASK_QUEUE,
    RunInput,
    admit_signal,
    pool_workflow_id,
    run_workflow_id,
    runtime_unknown,
)

log = logging.getLogger(__name__)


def search_attributes(run: Run) -> TypedSearchAttributes:
    """The Run's search attributes as of its start (the Run upserts only what is missing)."""
    values = {
        "KrtNamespace": run.metadata.namespace,
        "KrtRuntime": run.spec.runtime,
        "KrtMode": run.spec.mode.kind,
        "KrtTenant": run.spec.tenant or "",
        "KrtRunUid": run.metadata.uid or "",
        "KrtPhase": RunPhase.Pending.value,
    }
    return TypedSearchAttributes(
        [SearchAttributePair(SearchAttributeKey.for_keyword(k), v) for k, v in values.items()]
    )


async def start_run(client: Client, run: Run) -> WorkflowHandle[Any, Any]:
    """Start the Run's workflow, then send its admission to the pool.

    Raises what `Client.start_workflow` raises (WorkflowAlreadyStartedError for a running Run
    of that name); nothing is admitted then. Trouble reaching the pool never fails the start.
    """
    if run.metadata.uid is None:
        raise ValueError("metadata.uid must be set when a Run is started")
    handle: WorkflowHandle[Any, Any] = await client.start_workflow(
        "RunWorkflow",
        RunInput(run=run, starterAdmits=True),
        id=run_workflow_id(run.metadata.namespace, run.metadata.name),
        task_queue=TASK_QUEUE,
        search_attributes=search_attributes(run),
    )
    await admit(client, run, handle)
    return handle


async def admit(client: Client, run: Run, handle: WorkflowHandle[Any, Any]) -> None:
    """Hand a started Run's admission to its pool; a runtime without a pool rejects it at once."""
    signal = admit_signal(run, workflow_id=handle.id, at=datetime.now(UTC))
    try:
        await client.get_workflow_handle(pool_workflow_id(run.spec.runtime)).signal(SIGNAL_ADMIT, signal)
        return
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            log.warning(
                "could not hand the Run's admission to its pool; the Run asks the pool itself",
                extra={"run": handle.id, "status": err.status.name},
            )
            return
    try:  # to this execution only: a later Run of the same name is not ours to fail
        await client.get_workflow_handle(handle.id, run_id=handle.result_run_id).signal(
            SIGNAL_REJECTED, runtime_unknown(run)
        )
    except RPCError as err:
        log.warning(
            "could not tell the Run its runtime is unknown; the Run finds out itself",
            extra={"run": handle.id, "status": err.status.name},
        )
