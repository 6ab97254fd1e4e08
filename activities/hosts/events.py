"""Host events: what a provider's watch saw happen to a host, and where they go.

A watch (kubernetes_watch.PodWatch) calls a sink with one ``HostEvent`` per change: the host is
Ready, NotReady, Failed (its process ended), Evicted, or Deleted (deleting or gone). Sinks:

- ``HostEventQueue``: a bounded queue to consume with ``async for`` (the supervisor of hosts);
- ``WorkflowSignals``: signals the workflow a route names for each event. With
  ``HostWorkflowRoute`` an event that may mean a lost host becomes a ``provider_report`` signal
  to that host's HostWorkflow (naming the incarnation), which fences it and moves its Runs at once
  instead of at its next watch timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from enum import StrEnum

from temporalio.client import Client

from kruntimes.api.ids import HostId, HostUid, RuntimeName
from kruntimes.contracts.host import ProviderReport
from kruntimes.contracts.names import SIGNAL_PROVIDER_REPORT, host_workflow_id

log = logging.getLogger(__name__)


class HostEventKind(StrEnum):
    Ready = "Ready"  # the host became Ready
    NotReady = "NotReady"  # a Ready host is no longer Ready (its readiness check fails)
    Failed = "Failed"  # the host's process ended and will not restart
    Evicted = "Evicted"  # the node evicted the host
    Deleted = "Deleted"  # the host is being deleted, or is gone


# Events after which the host may be gone: its Runs may have to recover elsewhere.
LOSS = frozenset({HostEventKind.NotReady, HostEventKind.Failed, HostEventKind.Evicted, HostEventKind.Deleted})


@dataclass(frozen=True)
class HostEvent:
    kind: HostEventKind
    provider: str
    runtime: RuntimeName
    host_id: HostId
    host_uid: HostUid
    message: str = ""


HostEventSink = Callable[[HostEvent], None]


class HostEventQueue:
    """A sink that keeps at most ``limit`` events for a consumer (the oldest go first when full)."""

    def __init__(self, *, limit: int = 1024) -> None:
        self._queue: asyncio.Queue[HostEvent] = asyncio.Queue(maxsize=limit)
        self.dropped = 0

    def __call__(self, event: HostEvent) -> None:
        if self._queue.full():
            self._queue.get_nowait()
            self.dropped += 1
        self._queue.put_nowait(event)

    async def get(self) -> HostEvent:
        return await self._queue.get()

    async def __aiter__(self) -> AsyncIterator[HostEvent]:
        while True:
            yield await self._queue.get()


# Where a sink sends an event: (workflow id, signal name, argument), or None to drop it.
Route = Callable[[HostEvent], "tuple[str, str, object] | None"]


class WorkflowSignals:
    """A sink that signals workflows: ``route`` says which workflow gets which signal for an
    event. Events routed to the same (workflow, signal) within ``settle_s`` of each other make one
    signal, with the argument of the last. ``run`` sends them until cancelled; a signal that
    fails is logged and dropped (the periodic probe still finds the host).

    Each host's HostWorkflow takes its events through one of these (``HostWorkflowRoute``).
    """

    def __init__(self, client: Client, route: Route, *, settle_s: float = 0.05) -> None:
        self.client = client
        self.route = route
        self.settle_s = settle_s
        self.sent = 0
        self._pending: dict[tuple[str, str], object] = {}
        self._wake = asyncio.Event()

    def __call__(self, event: HostEvent) -> None:
        target = self.route(event)
        if target is not None:
            workflow_id, signal, argument = target
            self._pending[(workflow_id, signal)] = argument
            self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(self.settle_s)
            self._wake.clear()
            pending, self._pending = self._pending, {}
            for (workflow_id, signal), argument in pending.items():
                try:
                    await self.client.get_workflow_handle(workflow_id).signal(signal, argument)
                    self.sent += 1
                except Exception as e:
                    log.warning("could not signal %s %s: %s", workflow_id, signal, e)


class HostWorkflowRoute:
    """Routes an event that may mean a lost host to that host's HostWorkflow: a ProviderReport
    naming the pod's uid, so a report about an older incarnation never fences a newer one."""

    def __call__(self, event: HostEvent) -> tuple[str, str, object] | None:
        if event.kind not in LOSS or not event.host_id or not event.runtime:
            return None
        report = ProviderReport(
            lost=True,
            ready=False,
            reason=f"{event.provider.capitalize()}{event.kind}",
            message=event.message,
            hostUid=event.host_uid,
        )
        return host_workflow_id(event.runtime, event.host_id), SIGNAL_PROVIDER_REPORT, report
