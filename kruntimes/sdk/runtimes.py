"""The runtimes a platform serves, as its worker publishes them: one running pool workflow
(RuntimePoolWorkflow, `pool/{runtime}`) per runtime of its runtimes file. A Run naming a runtime
without one is refused at create (RuntimeNotFound, naming the runtimes there are) instead of
starting a Run that fails a moment later.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kruntimes.api.ids import RuntimeName
from kruntimes.contracts.names import pool_workflow_id
from kruntimes.sdk.errors import RuntimeNotFound

if TYPE_CHECKING:
    from temporalio.client import Client

POOLS = "WorkflowType='RuntimePoolWorkflow' AND ExecutionStatus='Running'"
POOL_PREFIX = pool_workflow_id(RuntimeName(""))


async def served(client: Client, runtime: RuntimeName) -> bool:
    """Whether the runtime's pool workflow runs."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError, RPCStatusCode

    try:
        description = await client.get_workflow_handle(pool_workflow_id(runtime)).describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return description.status == WorkflowExecutionStatus.RUNNING


async def runtimes(client: Client) -> list[str]:
    """The names of the runtimes whose pools run, sorted."""
    names = [
        execution.id.removeprefix(POOL_PREFIX)
        async for execution in client.list_workflows(POOLS)
        if execution.id.startswith(POOL_PREFIX)
    ]
    return sorted(set(names))


async def check_runtime(client: Client, runtime: RuntimeName) -> None:
    """RuntimeNotFound unless `runtime` is served."""
    if not await served(client, runtime):
        raise RuntimeNotFound(runtime, await runtimes(client))
