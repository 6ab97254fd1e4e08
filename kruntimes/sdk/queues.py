"""An operator's admission control of a runtime, over Temporal: read its queue (the pool's `pool`
query) and pause, resume or drain its admission (Updates of its pool workflow pool/{runtime},
acknowledged and recorded in the pool's history with who asked and why)."""

from __future__ import annotations

import builtins
from datetime import datetime
from typing import TYPE_CHECKING, Any

from kruntimes.api._base import ApiModel
from kruntimes.api.ids import RuntimeName
from kruntimes.contracts.names import (
    QUERY_POOL,
    UPDATE_DRAIN_QUEUE,
    UPDATE_PAUSE_QUEUE,
    UPDATE_RESUME_QUEUE,
    pool_workflow_id,
)
from kruntimes.contracts.pool import PoolQuery, PoolState, QueueActionInput, QueueActionResult, QueuedRun
from kruntimes.sdk.errors import ConfigError, KruntimesError

if TYPE_CHECKING:
    from kruntimes.sdk.runs import Runs


class QueueView(ApiModel):
    """A runtime's admission: paused or not (by whom, why, since when) and its queued Runs, FIFO."""

    runtime: RuntimeName
    paused: bool
    by: str = ""
    message: str = ""
    since: datetime | None = None
    queued: builtins.list[QueuedRun]


class Queues:
    def __init__(self, runs: Runs) -> None:
        self._runs = runs

    async def _call(self, call: Any, *, what: str, runtime: str) -> Any:
        from temporalio.client import (
            RPCError,
            RPCTimeoutOrCancelledError,
            WorkflowQueryFailedError,
            WorkflowUpdateFailedError,
        )
        from temporalio.service import RPCStatusCode

        try:
            return await call
        except RPCTimeoutOrCancelledError as e:
            raise ConfigError(f"Temporal did not answer for {what}: is the kruntimes worker running?") from e
        except (WorkflowUpdateFailedError, WorkflowQueryFailedError) as e:
            raise KruntimesError(f"{what} failed: {getattr(e, 'cause', None) or e}") from e
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                raise KruntimesError(f"no pool runs for runtime {runtime!r}") from e
            if e.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
                raise ConfigError(f"cannot reach Temporal for {what}: is `krt up` running?") from e
            raise KruntimesError(f"Temporal refused {what}: {e}") from e

    async def view(self, runtime: str) -> QueueView:
        handle = (await self._runs.temporal()).get_workflow_handle(pool_workflow_id(RuntimeName(runtime)))
        state: PoolState = await self._call(
            handle.query(QUERY_POOL, PoolQuery(reservations=False), result_type=PoolState),
            what=f"reading the queue of {runtime}",
            runtime=runtime,
        )
        control = state.admission
        return QueueView(
            runtime=RuntimeName(runtime),
            paused=control.paused,
            by=control.by,
            message=control.message,
            since=control.since,
            queued=state.queue,
        )

    async def act(self, update: str, runtime: str, *, message: str, requested_by: str) -> QueueActionResult:
        handle = (await self._runs.temporal()).get_workflow_handle(pool_workflow_id(RuntimeName(runtime)))
        request = QueueActionInput(message=message, requestedBy=requested_by)
        result: QueueActionResult = await self._call(
            handle.execute_update(update, request, result_type=QueueActionResult),
            what=f"the {update} of runtime {runtime}",
            runtime=runtime,
        )
        return result


ACTIONS = {"pause": UPDATE_PAUSE_QUEUE, "resume": UPDATE_RESUME_QUEUE, "drain": UPDATE_DRAIN_QUEUE}
