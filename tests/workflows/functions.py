"""A test platform's Functions: a manifest, its workflow started as the SDK starts it, its status
and replicas as the workflow answers them, and a rollout waited for."""

from __future__ import annotations

import uuid
from typing import Any

from temporalio.client import WorkflowHandle

from kruntimes.api.function import Function, FunctionPhase, FunctionStatus
from kruntimes.contracts.function import FunctionInput, ReplicaView
from kruntimes.contracts.names import QUERY_REPLICAS, QUERY_STATUS, function_workflow_id
from kruntimes.wire import search_typed
from kruntimes.workflows.function import FunctionWorkflow
from tests.support.waiting import eventually
from tests.workflows.conftest import ECHO, Platform


def function_manifest(name: str, *, runtime: str, source: str = ECHO, **spec: Any) -> Function:
    return Function.new(
        name,
        runtime=runtime,
        handler="main:handle",
        inline={"main.py": source},
        uid=str(uuid.uuid4()),
        **spec,
    )


async def start_function(platform: Platform, fn: Function) -> WorkflowHandle[Any, FunctionStatus]:
    handle = await platform.client.start_workflow(
        FunctionWorkflow.run,
        FunctionInput(function=fn),
        id=function_workflow_id(fn.metadata.namespace, fn.metadata.name),
        task_queue=platform.settings.run_task_queue,
        search_attributes=search_typed.function_at_start(fn),
    )
    platform.started.append(handle)
    return handle


async def function_status(handle: WorkflowHandle[Any, Any]) -> FunctionStatus:
    return await handle.query(QUERY_STATUS, result_type=FunctionStatus)


async def replicas_of(handle: WorkflowHandle[Any, Any]) -> list[ReplicaView]:
    return await handle.query(QUERY_REPLICAS, result_type=list[ReplicaView])


async def function_rolled_out(
    platform: Platform, handle: WorkflowHandle[Any, Any], *, revision: int, ready: int
) -> None:
    """The Function Ready at `revision` with `ready` replicas, and no replica of another."""

    async def done() -> bool:
        status, replicas = await function_status(handle), await replicas_of(handle)
        return (
            status.phase is FunctionPhase.Ready
            and status.observedRevision == revision
            and status.replicas.ready == ready
            and len(replicas) == ready
            and all(r.revision == revision and r.phase == "Ready" for r in replicas)
        )

    await eventually(
        done, within=90, every=0.1, what=f"revision {revision} with {ready} Ready replicas alone"
    )
