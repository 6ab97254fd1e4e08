"""The known-Runs view: which Runs exist and are not finished, as Temporal visibility shows them,
refreshed by what changed. Two readers keep one: the gateway (gateway/server.py), whose route-cache
miss consults it to answer 503 (known, not ready, recovering or terminating) rather than 404, in
the background and never on the invoke path; and the reconciler (activities/reconcile.py), which
refreshes it at the start of each round instead of listing every Run of its runtime twice.

A refresh costs what changed, not every Run: after one full listing, each refresh asks only for
the Runs started and terminated since the last one (by StartTime and CloseTime, with a margin
for visibility's lag: MARGIN, or NEAR_MARGIN with a look back every LOOKBACK_EVERY refreshes)
and those whose phase changed (a terminal phase while their workflow still runs is kept, for their
retention); a full listing again every FULL_REFRESH_S mends anything a narrow query could have
missed. A full listing costs the dev server CPU in proportion to every Run (reading and encoding
the rows); a narrow refresh with nothing changed costs next to nothing.

Each narrow query is one a SQL visibility store answers from an index, not by reading every
running workflow. The dev server's SQLite picks the index from a query's equalities:
`ExecutionStatus='Running'` beside a condition on an attribute makes it read every running
workflow's row, every refresh, for no row: the known-Runs view would be most of what an idle
server does. So the Runs whose phase changed are asked for by `KrtPhaseSince >= T` alone (its own
index: the Runs that changed, however many there are; the execution's status in each answer
tells a finished Run whose workflow closed from one still running), the new ones by StartTime
among the running, and the Runs terminated from outside (which index no phase) by their own
status. A change indexed without KrtPhaseSince shows at the next full listing. The queries of
a refresh go out together; their answers are applied as one change.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import ClassVar, Generic, Protocol, TypeVar

from kruntimes.wire import search

log = logging.getLogger(__name__)
T = TypeVar("T")

REFRESH_S = 2.0
# A full listing reads every Run (a page per thousand, the dev server's CPU for each): it only
# mends what the narrow queries missed, so it comes seldom.
FULL_REFRESH_S = 300.0
MAX_KNOWN = 200_000
MAX_CHANGES = 20_000  # Runs one narrow query lists at most; beyond it, a full listing
QUERY = "WorkflowType='RunWorkflow' AND ExecutionStatus='Running'"
# A Run's workflow ends with a phase indexed unless it is terminated from outside. Asked for by
# that one status, the closed ones come from its index; `ExecutionStatus != 'Running'`, an IN or
# an OR of the other ends makes the dev server read every RunWorkflow's row, every refresh. A
# workflow that failed or timed out (our RunWorkflow sets no execution timeout and fails only its
# tasks) shows at the next full listing.
CLOSED = "WorkflowType='RunWorkflow' AND ExecutionStatus='Terminated'"
# Visibility is written a little after the change it shows, seconds later under load. A narrow
# refresh asks for what changed since the last one began, less NEAR_MARGIN (clocks, the usual
# lag); every LOOKBACK_EVERY-th asks from MARGIN before the last such look back began, so a change
# whose visibility came later than that still shows, within LOOKBACK_EVERY refreshes of it. Every
# refresh looking back the whole MARGIN would list each new Run several times while Runs are
# being created, at the dev server's cost for every create.
MARGIN = timedelta(seconds=10)
NEAR_MARGIN = timedelta(seconds=1)
LOOKBACK_EVERY = 5


@dataclass(frozen=True, slots=True)
class Execution:
    """One execution as a listing shows it: what the view reads of it."""

    workflow_id: str
    search_attributes: dict[str, str]  # keyword attributes, their first value
    running: bool = True


class Lister(Protocol):
    """A visibility listing: the executions `query` matches, at most `limit`, page by page
    (gateway/visibility.py over gRPC; activities/reconcile.py with the worker's Temporal client)."""

    def list(self, query: str, *, limit: int) -> AsyncIterator[Execution]: ...


# A JSON string with nothing escaped (every keyword the platform indexes): its text is what lies
# between the quotes, read without a JSON parser (a listing decodes four of them a Run).
_PLAIN_STRING = re.compile(rb'"[^"\\\x00-\x1f]*"')


def keyword(encoding: bytes | None, data: bytes) -> str | None:
    """A keyword (or text) search attribute's value as visibility sends it (JSON: a string, or a
    list whose first item is it); None when it is not one."""
    if encoding != b"json/plain":
        return None
    if _PLAIN_STRING.fullmatch(data):
        try:
            return data[1:-1].decode()
        except UnicodeDecodeError:
            return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class KnownRun:
    namespace: str
    name: str
    runtime: str
    phase: str

    @property
    def workflow_id(self) -> str:
        """Its Run's workflow id (`kruntimes.contracts.names.run_workflow_id`, which loads pydantic:
        the gateway does not)."""
        return f"run/{self.namespace}/{self.name}"


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


class KnownView(Generic[T]):
    """A view of some workflows as visibility lists them, by uid, refreshed by what changed (the
    module's docstring says how). What it lists and how it reads a listing are its subclass's:
    `FULL` (every one that exists), `narrow(at)` (those started, ended or changed since `at`) and
    `parse` (an execution's uid and entry, or None). KnownRuns lists Runs; the gateway's
    KnownFunctions (known_functions.py) Functions."""

    FULL: ClassVar[str]
    NAME: ClassVar[str] = "known"  # for its log line

    def __init__(
        self,
        client: Lister | None,
        *,
        refresh_s: float = REFRESH_S,
        full_refresh_s: float = FULL_REFRESH_S,
        margin: timedelta = MARGIN,
        near_margin: timedelta = NEAR_MARGIN,
        lookback_every: int = LOOKBACK_EVERY,
    ) -> None:
        self.client = client
        self.refresh_s = refresh_s
        self.full_refresh_s = full_refresh_s
        self.margin = margin
        self.near_margin = near_margin
        self.lookback_every = max(lookback_every, 1)  # 1: every refresh looks back the whole margin
        self.entries: dict[str, T] = {}
        self.refreshed = False
        self.listed = 0  # executions the last refresh read (what it cost)
        self._since: datetime | None = None  # the start of the last refresh
        self._looked_back: datetime | None = None  # the start of the last full or look-back one
        self._near = 0  # refreshes since that one
        self._full_at = 0.0
        self._task: asyncio.Task[None] | None = None

    def get(self, uid: str) -> T | None:
        return self.entries.get(uid)

    def narrow(self, at: str) -> tuple[str, ...]:
        """The queries of what started, ended or changed since `at` (visibility's time format)."""
        raise NotImplementedError

    def parse(self, execution: Execution) -> tuple[str, T] | None:
        """An execution's uid and entry, or None when it does not carry one."""
        raise NotImplementedError

    async def refresh(self) -> None:
        if self.client is None:
            return
        begun, since, looked_back = datetime.now(UTC), self._since, self._looked_back
        look_back = self._near + 1 >= self.lookback_every
        if since is None or looked_back is None or time.monotonic() - self._full_at >= self.full_refresh_s:
            start = None
        else:
            start = looked_back - self.margin if look_back else since - self.near_margin
        if start is None or not await self._changes(start):
            await self._full()
            look_back = True  # a full listing reads all that a look back would
        self._since = begun
        if look_back:
            self._looked_back, self._near = begun, 0
        else:
            self._near += 1
        self.refreshed = True

    async def _full(self) -> None:
        assert self.client is not None
        entries: dict[str, T] = {}
        listed = 0
        async for execution in self.client.list(self.FULL, limit=MAX_KNOWN):
            listed += 1
            known = self.parse(execution)
            if known is not None:
                entries[known[0]] = known[1]
        self.entries = entries
        self.listed = listed
        self._full_at = time.monotonic()

    async def _changes(self, since: datetime) -> bool:
        """Apply what changed since `since`; False when there was too much to list narrowly."""
        assert self.client is not None
        at = since.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        found = await asyncio.gather(*(self._narrow(q) for q in self.narrow(at)))
        answers = [answer for answer in found if answer is not None]
        if len(answers) < len(found):
            return False
        # A Run is running if any of its executions the answers show runs (a closed one may be
        # an earlier run of its workflow); of the running ones the last answer's is kept (the
        # phase a change indexed, asked for last, is newer than the one a Run started with).
        running: dict[str, T] = {}
        closed: set[str] = set()
        listed = 0
        for answer in answers:
            listed += len(answer)
            for execution in answer:
                known = self.parse(execution)
                if known is None:
                    continue
                if execution.running:
                    running[known[0]] = known[1]
                else:
                    closed.add(known[0])
        for uid in closed - running.keys():  # in place: no await between here and the end
            self.entries.pop(uid, None)
        self.entries.update(running)
        self.listed = listed
        return True

    async def _narrow(self, query: str) -> list[Execution] | None:
        """What `query` lists, or None if that is more than MAX_CHANGES."""
        assert self.client is not None
        found = [e async for e in self.client.list(query, limit=MAX_CHANGES + 1)]
        return None if len(found) > MAX_CHANGES else found

    def start(self) -> None:
        if self.client is not None:
            self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as exc:
                log.warning("%s refresh failed: %s", self.NAME, type(exc).__name__)
            await asyncio.sleep(self.refresh_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


class KnownRuns(KnownView[KnownRun]):
    """The Runs that exist and are not finished, by run uid."""

    FULL = QUERY
    NAME = "known-Runs"

    @property
    def runs(self) -> dict[str, KnownRun]:
        return self.entries

    @runs.setter
    def runs(self, runs: dict[str, KnownRun]) -> None:
        self.entries = runs

    def narrow(self, at: str) -> tuple[str, ...]:
        # ended first, phase changes last: of the running ones the last answer's entry is kept
        return (
            f"{CLOSED} AND CloseTime >= '{at}'",
            f"{QUERY} AND StartTime >= '{at}'",
            f"{search.PHASE_SINCE} >= '{at}'",
        )

    def parse(self, execution: Execution) -> tuple[str, KnownRun] | None:
        return _known(execution)
