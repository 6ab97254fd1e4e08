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

import asyncio
import logging
import weakref
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from kruntimes.api.ids import RuntimeName
from kruntimes.api.run import Run
from kruntimes.contracts.names import (
    MAX_ADMISSIONS_PER_SIGNAL,
    SIGNAL_ADMIT,
    SIGNAL_ADMIT_MANY,
    SIGNAL_REJECTED,
    TASK_QUEUE,
    invoke_url,
    pool_workflow_id,
    run_workflow_id,
)
from kruntimes.contracts.pool import AdmitMany, AdmitSignal, admit_signal, runtime_unknown
from kruntimes.contracts.run import RunInput
from kruntimes.system.futures import fail
from kruntimes.wire import search_typed, summaries

log = logging.getLogger(__name__)

# A workflow task of the Run that a dying worker had taken is given to another worker after this
# long (the server's default is 10 s). The Run's tasks take milliseconds; one that waits on a long
# registration is kept alive by the SDK's task heartbeats.
RUN_TASK_TIMEOUT = timedelta(seconds=5)


async def start_run(
    client: Client, run: Run, *, task_queue: str = TASK_QUEUE, gateway_url: str | None = None
) -> WorkflowHandle[Any, Any]:
    """Start the Run's workflow on `task_queue` (where the Runs' workers poll), then send its
    admission to the pool. The workflow's static summary and details (the Temporal UI's) say what
    the Run is; with `gateway_url` the details name the URL it is invoked at.

    Raises what `Client.start_workflow` raises (WorkflowAlreadyStartedError for a running Run
    of that name); nothing is admitted then. Trouble reaching the pool never fails the start.
    """
    if run.metadata.uid is None:
        raise ValueError("metadata.uid must be set when a Run is started")
    handle: WorkflowHandle[Any, Any] = await client.start_workflow(
        "RunWorkflow",
        RunInput(run=run, starterAdmits=True, statusMemo=True),
        id=run_workflow_id(run.metadata.namespace, run.metadata.name),
        task_queue=task_queue,
        search_attributes=search_typed.at_start(run),
        task_timeout=RUN_TASK_TIMEOUT,
        static_summary=summaries.run_summary(run),
        static_details=summaries.run_details(run, endpoint=_endpoint(run, gateway_url)),
    )
    await admit(client, run, handle)
    return handle


def _endpoint(run: Run, gateway_url: str | None) -> str | None:
    if gateway_url is None or run.spec.mode.kind != "function" or run.metadata.uid is None:
        return None
    return invoke_url(
        gateway_url, namespace=run.metadata.namespace, runtime=run.spec.runtime, run_uid=run.metadata.uid
    )


class _Admissions:
    """A process's admissions to one pool, sent as they come: alone when nothing else is being
    sent, else all that queued up meanwhile in one admit_many signal (a burst of creates from one
    process costs the pool a few signals, not one each; a lone create waits for nothing)."""

    def __init__(self, client: Client, runtime: RuntimeName) -> None:
        self.pool = client.get_workflow_handle(pool_workflow_id(runtime))
        self.pending: list[tuple[AdmitSignal, asyncio.Future[RPCError | None]]] = []
        self.sender: asyncio.Task[None] | None = None

    async def send(self, signal: AdmitSignal) -> RPCError | None:
        """The signal's fate: None when the pool has it, else the error that kept it out."""
        sent: asyncio.Future[RPCError | None] = asyncio.get_running_loop().create_future()
        self.pending.append((signal, sent))
        if self.sender is None or self.sender.done():
            self.sender = asyncio.create_task(self._send_pending())  # not the caller's: a cancelled
        return await asyncio.shield(sent)  # caller must not strand the others' admissions

    async def _send_pending(self) -> None:
        while self.pending:
            batch = self.pending[:MAX_ADMISSIONS_PER_SIGNAL]
            del self.pending[: len(batch)]
            error: RPCError | None = None
            try:
                if len(batch) == 1:
                    await self.pool.signal(SIGNAL_ADMIT, batch[0][0])
                else:
                    await self.pool.signal(SIGNAL_ADMIT_MANY, AdmitMany(admissions=[a for a, _ in batch]))
            except RPCError as err:
                error = err
            except BaseException as exc:  # no caller may wait forever for its admission's fate
                for _, sent in [*batch, *self.pending]:
                    fail(sent, exc)
                self.pending.clear()
                raise
            for _, sent in batch:
                if not sent.done():
                    sent.set_result(error)


_admissions: weakref.WeakKeyDictionary[Client, dict[str, _Admissions]] = weakref.WeakKeyDictionary()


async def admit(client: Client, run: Run, handle: WorkflowHandle[Any, Any]) -> None:
    """Hand a started Run's admission to its pool; a runtime without a pool rejects it at once."""
    signal = admit_signal(run, workflow_id=handle.id, at=datetime.now(UTC), handoff=True)
    pools = _admissions.setdefault(client, {})
    sender = pools.get(run.spec.runtime)
    if sender is None:
        sender = pools[run.spec.runtime] = _Admissions(client, run.spec.runtime)
    err = await sender.send(signal)
    if err is None:
        return
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
