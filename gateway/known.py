"""The known-Runs view: which Runs exist and are not finished, refreshed in the background from
Temporal visibility. Only a route-cache miss consults it, to answer 503 (known, not ready,
recovering or terminating) rather than 404. The invoke path never waits for it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from temporalio.client import Client

from kruntimes.wire import search

log = logging.getLogger(__name__)

REFRESH_S = 2.0
MAX_KNOWN = 200_000
QUERY = "WorkflowType='RunWorkflow' AND ExecutionStatus='Running'"


@dataclass(frozen=True, slots=True)
class KnownRun:
    namespace: str
    name: str
    runtime: str
    phase: str


def _first(attrs: dict[str, list[object]], key: str) -> str:
    values = attrs.get(key) or [""]
    return str(values[0])


class KnownRuns:
    def __init__(self, client: Client | None, *, refresh_s: float = REFRESH_S) -> None:
        self.client = client
        self.refresh_s = refresh_s
        self.runs: dict[str, KnownRun] = {}
        self.refreshed = False
        self._task: asyncio.Task[None] | None = None

    def get(self, run_uid: str) -> KnownRun | None:
        return self.runs.get(run_uid)

    async def refresh(self) -> None:
        if self.client is None:
            return
        runs: dict[str, KnownRun] = {}
        async for execution in self.client.list_workflows(QUERY, limit=MAX_KNOWN):
            attrs = execution.search_attributes
            uid = _first(attrs, search.RUN_UID)  # type: ignore[arg-type]
            if uid:
                name = execution.id.rsplit("/", 1)[-1]
                runs[uid] = KnownRun(
                    namespace=_first(attrs, search.NAMESPACE),  # type: ignore[arg-type]
                    name=name,
                    runtime=_first(attrs, search.RUNTIME),  # type: ignore[arg-type]
                    phase=_first(attrs, search.PHASE),  # type: ignore[arg-type]
                )
        self.runs = runs
        self.refreshed = True

    def start(self) -> None:
        if self.client is not None:
            self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as exc:
                log.warning("known-Runs refresh failed: %s", type(exc).__name__)
            await asyncio.sleep(self.refresh_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
