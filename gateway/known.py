"""The known-Runs view: which Runs exist and are not finished, refreshed in the background from
Temporal visibility (gateway/visibility.py). Only a route-cache miss consults it, to answer 503
(known, not ready, recovering or terminating) rather than 404. The invoke path never waits for it.

A refresh costs what changed, not every Run: after one full listing, each refresh asks only for
the Runs started and closed since the last one (by StartTime and CloseTime, with a margin) and
those that reached a terminal phase while their workflow still runs (kept for their retention);
a full listing again every FULL_REFRESH_S mends anything a narrow query could have missed.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from gateway.visibility import Execution, Visibility
from kruntimes.api.phases import TERMINAL_PHASES
from kruntimes.wire import search

log = logging.getLogger(__name__)

REFRESH_S = 2.0
FULL_REFRESH_S = 60.0
MAX_KNOWN = 200_000
MAX_CHANGES = 20_000  # Runs one narrow query lists at most; beyond it, a full listing
QUERY = "WorkflowType='RunWorkflow' AND ExecutionStatus='Running'"
# Visibility is written a little after the change it shows: the narrow queries look back this far.
MARGIN = timedelta(seconds=10)
_TERMINAL = ", ".join(f"'{p.value}'" for p in sorted(TERMINAL_PHASES))


@dataclass(frozen=True, slots=True)
class KnownRun:
    namespace: str
    name: str
    runtime: str
    phase: str


def _known(execution: Execution) -> tuple[str, KnownRun] | None:
    attrs = execution.search_attributes
    uid = attrs.get(search.RUN_UID, "")
    if not uid:
        return None
    # The few namespaces, runtimes and phases are kept once (interned), not once a Run.
    return uid, KnownRun(
        namespace=sys.intern(attrs.get(search.NAMESPACE, "")),
        name=execution.workflow_id.rsplit("/", 1)[-1],
        runtime=sys.intern(attrs.get(search.RUNTIME, "")),
        phase=sys.intern(attrs.get(search.PHASE, "")),
    )


class KnownRuns:
    def __init__(
        self,
        client: Visibility | None,
        *,
        refresh_s: float = REFRESH_S,
        full_refresh_s: float = FULL_REFRESH_S,
        margin: timedelta = MARGIN,
    ) -> None:
        self.client = client
        self.refresh_s = refresh_s
        self.full_refresh_s = full_refresh_s
        self.margin = margin
        self.runs: dict[str, KnownRun] = {}
        self.refreshed = False
        self.listed = 0  # executions the last refresh read (what it cost)
        self._since: datetime | None = None  # the start of the last refresh
        self._full_at = 0.0
        self._task: asyncio.Task[None] | None = None

    def get(self, run_uid: str) -> KnownRun | None:
        return self.runs.get(run_uid)

    async def refresh(self) -> None:
        if self.client is None:
            return
        begun, since = datetime.now(UTC), self._since
        due = since is None or time.monotonic() - self._full_at >= self.full_refresh_s
        if since is None or due or not await self._changes(since - self.margin):
            await self._full()
        self._since = begun
        self.refreshed = True

    async def _full(self) -> None:
        assert self.client is not None
        runs: dict[str, KnownRun] = {}
        listed = 0
        async for execution in self.client.list(QUERY, limit=MAX_KNOWN):
            listed += 1
            known = _known(execution)
            if known is not None:
                runs[known[0]] = known[1]
        self.runs = runs
        self.listed = listed
        self._full_at = time.monotonic()

    async def _changes(self, since: datetime) -> bool:
        """Apply what changed since `since`; False when there was too much to list narrowly."""
        assert self.client is not None
        at = since.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        started = f"{QUERY} AND StartTime >= '{at}'"
        finished = f"{QUERY} AND {search.PHASE} IN ({_TERMINAL})"
        closed = f"WorkflowType='RunWorkflow' AND ExecutionStatus!='Running' AND CloseTime >= '{at}'"
        listed = 0
        runs = dict(self.runs)
        for query, keep in ((closed, False), (started, True), (finished, True)):
            count = 0
            async for execution in self.client.list(query, limit=MAX_CHANGES + 1):
                count += 1
                known = _known(execution)
                if known is None:
                    continue
                if keep:
                    runs[known[0]] = known[1]
                else:
                    runs.pop(known[0], None)
            if count > MAX_CHANGES:
                return False
            listed += count
        self.runs = runs
        self.listed = listed
        return True

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
