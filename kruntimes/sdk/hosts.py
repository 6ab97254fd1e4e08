"""The operators' host actions over Temporal, acknowledged and recorded in the workflows'
histories: drain a host, delete a host (Updates of its HostWorkflow host/{runtime}/{host}), run
an orphan collection now (the `collect` Update of each runtime's ReconcileWorkflow)."""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any

from kruntimes.api.ids import HostId, RuntimeName
from kruntimes.contracts.host import HostActionInput, HostActionResult
from kruntimes.contracts.names import (
    UPDATE_COLLECT,
    UPDATE_DELETE_HOST,
    UPDATE_DRAIN_HOST,
    host_workflow_id,
    reconcile_workflow_id,
)
from kruntimes.contracts.reconcile import ReconcileReport
from kruntimes.sdk.errors import ConfigError, HostNotFound, KruntimesError

if TYPE_CHECKING:
    from kruntimes.sdk.runs import Runs


class Hosts:
    def __init__(self, runs: Runs) -> None:
        self._runs = runs

    async def _call(self, call: Any, *, what: str, host: str | None = None) -> Any:
        """Await a Temporal call for `what`, mapping its errors onto the SDK's."""
        from temporalio.client import RPCError, RPCTimeoutOrCancelledError, WorkflowUpdateFailedError
        from temporalio.service import RPCStatusCode

        try:
            return await call
        except RPCTimeoutOrCancelledError as e:
            raise ConfigError(f"Temporal did not answer for {what}: is the kruntimes worker running?") from e
        except WorkflowUpdateFailedError as e:
            raise KruntimesError(f"{what} failed: {e.cause or e}") from e
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND and host is not None:
                raise HostNotFound(host, "it has no supervisor (HostWorkflow) running") from e
            if e.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
                raise ConfigError(f"cannot reach Temporal for {what}: is `krt up` running?") from e
            raise KruntimesError(f"Temporal refused {what}: {e}") from e

    async def _runtime_of(self, name: str, runtime: str | None) -> str:
        """The runtime of the pool host called `name` (the pools are asked)."""
        views = await self._runs.hosts()
        found = sorted(
            {v.host.runtime for v in views if v.host.hostId == name and runtime in (None, v.host.runtime)}
        )
        if not found:
            raise HostNotFound(name)
        if len(found) > 1:
            raise KruntimesError(f"host {name!r} is in runtimes {', '.join(found)}: name one")
        return found[0]

    async def _act(
        self, update: str, name: str, *, runtime: str | None, message: str, requested_by: str
    ) -> HostActionResult:
        rt = await self._runtime_of(name, runtime)
        handle = (await self._runs.temporal()).get_workflow_handle(
            host_workflow_id(RuntimeName(rt), HostId(name))
        )
        request = HostActionInput(message=message, requestedBy=requested_by)
        result: HostActionResult = await self._call(
            handle.execute_update(update, request, result_type=HostActionResult),
            what=f"the {update} of host {name}",
            host=name,
        )
        return result

    async def drain(
        self, name: str, *, runtime: str | None, message: str, requested_by: str
    ) -> HostActionResult:
        return await self._act(
            UPDATE_DRAIN_HOST, name, runtime=runtime, message=message, requested_by=requested_by
        )

    async def delete(
        self, name: str, *, runtime: str | None, message: str, requested_by: str
    ) -> HostActionResult:
        return await self._act(
            UPDATE_DELETE_HOST, name, runtime=runtime, message=message, requested_by=requested_by
        )

    async def reconcile(self, runtime: str | None) -> builtins.list[ReconcileReport]:
        client = await self._runs.temporal()
        runtimes: builtins.list[str] = []

        async def listing() -> None:
            query = "WorkflowType='ReconcileWorkflow' AND ExecutionStatus='Running'"
            async for execution in client.list_workflows(query):
                rt = execution.id.removeprefix(reconcile_workflow_id(RuntimeName("")))
                if runtime in (None, rt):
                    runtimes.append(rt)

        await self._call(listing(), what="listing the reconcilers")
        if runtime is not None and not runtimes:
            raise KruntimesError(f"no reconciler runs for runtime {runtime!r}")
        reports = []
        for rt in sorted(runtimes):
            handle = client.get_workflow_handle(reconcile_workflow_id(RuntimeName(rt)))
            report: ReconcileReport = await self._call(
                handle.execute_update(UPDATE_COLLECT, result_type=ReconcileReport),
                what=f"the orphan collection of runtime {rt}",
            )
            reports.append(report)
        return reports
