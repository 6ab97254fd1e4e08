"""The supervision stream of one host (FunctionRuntime.WatchHost): what the control plane watches.

A watcher gets a HostReport at once, then one every interval, and one at once whenever the
host's registrations change (registered, unregistered, not ready). A report carries the host's
identity and health, every registration with its running and waiting invocations, the
invocations running on the host and its bound on them, the running tasks, how function
processes are isolated, and the gateways it sends heartbeats to. The control plane takes a
report that stops coming as the host being frozen or gone.

A watch request may name the gateways' current heartbeat addresses: the host sends its route
heartbeats there from then on, so a host started with an address that went stale learns the new
one as soon as it is watched.

A watcher that asks for deltas gets every registration in the stream's first report only; each
later report carries the registrations added or changed since the stream's previous report and
the ids of those removed, so what the watcher reads and compares is proportional to what changed,
not to the host's registrations. Reports are numbered per stream: a gap means one was missed,
and the watcher watches anew (its first report is whole again).

A watcher that asks for losses is told by the host which registrations stopped serving (were
ready when the host last looked, and are gone or not ready now), so it needs to keep nothing per
registration to tell their Runs. The host looks at every report it builds (for any stream) and
numbers each loss in a journal of its incarnation (the last LOSS_JOURNAL of them); a stream
carries the losses after its previous report, and a watcher that reconnects resumes after the
last position it took, so a broken stream loses none the host still holds.

Everything here runs on the host's event loop; `changed` may be called from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from kruntimes.rpc.v1 import runtime_pb2 as pb

# Bounds of a watcher's interval: often enough to notice a frozen host in seconds, rarely enough
# that a host with many watchers is not busy reporting.
MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 60.0
# Watchers of one host at once (the HostWorkflow's activity, plus a restarted one for a while).
MAX_WATCHERS = 16
# Losses a host keeps for watchers that resume (a small record each): a watcher away for more than this
# many misses the oldest, and the reconciler finds those Runs (their registrations are gone).
LOSS_JOURNAL = 1024
_READY = pb.REGISTRATION_PHASE_READY


class Health:
    """Whether the host takes work; `serving` is False once it is shutting down."""

    def __init__(self) -> None:
        self.serving = True
        self.message = ""


class HostWatch:
    def __init__(
        self,
        *,
        host_id: str,
        host_uid: str,
        runtime: str,
        interval_s: float,
        registrations: Callable[[], list[pb.RegistrationState]],
        running_tasks: Callable[[], int],
        isolation: Callable[[], dict[str, str]],
        gateways: Callable[[], list[pb.GatewayLink]],
        set_gateways: Callable[[list[str]], None],
        health: Health,
        journal: int = LOSS_JOURNAL,
        invocations: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        """`invocations`: the invocations running on the host and its bound on them."""
        self.host_id = host_id
        self.host_uid = host_uid
        self.runtime = runtime
        self.interval_s = interval_s
        self.registrations = registrations
        self.running_tasks = running_tasks
        self.isolation = isolation
        self.gateways = gateways
        self.set_gateways = set_gateways
        self.health = health
        self.invocations = invocations
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeups: set[asyncio.Event] = set()
        self._serving: dict[str, pb.RegistrationState] = {}  # ready when the host last looked
        self._journal: deque[pb.RegistrationLoss] = deque(maxlen=journal)
        self._position = 0  # of the last loss journalled

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the watchers run on (the host's)."""
        self._loop = loop

    def changed(self) -> None:
        """Registrations changed: every watcher gets a report now (thread-safe)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop is stopping
            loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        for event in self._wakeups:
            event.set()

    def report(
        self,
        sequence: int,
        sent: dict[str, pb.RegistrationState] | None = None,
        losses: LossCursor | None = None,
    ) -> pb.HostReport:
        """The report numbered `sequence`. With `sent` (what this stream reported so far, by
        registration id, updated here), a delta against it unless it is the stream's first. With
        `losses` (where this stream is in the journal, moved here), the losses after it."""
        sent_at = Timestamp()
        sent_at.FromDatetime(datetime.now(UTC))
        registrations = self.registrations()
        current = {r.registration_id: r for r in registrations}
        self._look(current)
        delta = sent is not None and sequence > 1
        removed: list[str] = []
        if sent is not None:
            if delta:
                removed = sorted(set(sent) - set(current))
                registrations = [r for r in registrations if _changed(sent.get(r.registration_id), r)]
            sent.clear()
            sent.update(current)
        report = pb.HostReport(
            host_id=self.host_id,
            host_uid=self.host_uid,
            runtime=self.runtime,
            sequence=sequence,
            sent_at=sent_at,
            health=pb.HostHealth(serving=self.health.serving, message=self.health.message),
            registrations=registrations,
            running_tasks=self.running_tasks(),
            isolation=self.isolation(),
            gateways=self.gateways(),
            delta=delta,
            removed=removed,
        )
        if self.invocations is not None:
            report.running_invocations, report.max_invocations = self.invocations()
        if losses is not None:
            report.reports_losses = True
            lost, report.lost_truncated = self._losses_after(losses.after)
            report.lost.extend(lost)
            report.lost_position = losses.after = self._position
        return report

    def _look(self, current: dict[str, pb.RegistrationState]) -> None:
        """Journal every registration that was ready when the host last looked and is not now."""
        serving = {i: r for i, r in current.items() if r.phase == _READY}
        for reg_id, before in self._serving.items():
            if reg_id in serving:
                continue
            now = current.get(reg_id)
            self._position += 1
            self._journal.append(
                pb.RegistrationLoss(
                    position=self._position, registration=_identity(now or before), gone=now is None
                )
            )
        self._serving = serving

    def _losses_after(self, after: int | None) -> tuple[list[pb.RegistrationLoss], bool]:
        """The journalled losses after position `after` (None: from now on, none), and whether
        the journal no longer holds some of them (or `after` is not a position of this host)."""
        if after is None or after == self._position:
            return [], False
        if after > self._position:  # not ours: another incarnation's, or made up
            return [], True
        lost: list[pb.RegistrationLoss] = []
        for loss in reversed(self._journal):
            if loss.position <= after:
                break
            lost.append(loss)
        lost.reverse()
        return lost, not lost or lost[0].position != after + 1

    def interval_of(self, request: pb.WatchHostRequest) -> float:
        if request.interval_ms == 0:
            return self.interval_s
        return min(max(request.interval_ms / 1000.0, MIN_INTERVAL_S), MAX_INTERVAL_S)

    async def stream(self, request: pb.WatchHostRequest) -> AsyncIterator[pb.HostReport]:
        """Reports until the watcher goes away (or the host stops serving: one last report)."""
        if len(self._wakeups) >= MAX_WATCHERS:
            raise OverflowError(f"the host already has {MAX_WATCHERS} watchers")
        if request.set_gateways:
            self.set_gateways(list(request.gateways))
        interval = self.interval_of(request)
        wakeup = asyncio.Event()
        self._wakeups.add(wakeup)
        sent: dict[str, pb.RegistrationState] | None = {} if request.deltas else None
        losses = None
        if request.losses:
            losses = LossCursor(request.lost_after if request.resume else None)
        try:
            sequence = 0
            while True:
                sequence += 1
                wakeup.clear()
                yield self.report(sequence, sent, losses)
                if not self.health.serving:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wakeup.wait(), interval)
        finally:
            self._wakeups.discard(wakeup)

    def stop_serving(self, message: str) -> None:
        """The host is shutting down: watchers get a last report saying so."""
        self.health.serving = False
        self.health.message = message
        self.changed()


class LossCursor:
    """Where one stream is in its host's journal of losses (None: at its first report, from
    then on)."""

    __slots__ = ("after",)

    def __init__(self, after: int | None) -> None:
        self.after = after


def _identity(registration: pb.RegistrationState) -> pb.RegistrationState:
    """What a loss tells of its registration: who it is and its phase, not its assignment."""
    return pb.RegistrationState(
        run_uid=registration.run_uid,
        attempt=registration.attempt,
        namespace=registration.namespace,
        name=registration.name,
        runtime=registration.runtime,
        registration_id=registration.registration_id,
        phase=registration.phase,
    )


def _changed(before: pb.RegistrationState | None, now: pb.RegistrationState) -> bool:
    """Whether a registration differs from what a stream reported (the host reuses an unchanged
    registration's message: identity answers without comparing)."""
    return before is not now and before != now
