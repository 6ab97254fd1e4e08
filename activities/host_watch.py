"""The supervision of one host: a long-running activity holding its WatchHost stream.

The host reports at once, every interval and on every change of its registrations. The activity
heartbeats while it watches (a dead worker's watch is retried elsewhere within seconds) and ends
only with a verdict for its HostWorkflow:

    Lost    the host is dead, frozen, replaced, not serving, or its stream keeps failing
            (kruntimes.decisions.hostlife.WatchRules decides; the reason is a LossReason)
    Renew   it watched for maxSeconds: the workflow starts the next watch

With tellReady it signals its HostWorkflow (`watch_ready`) at the first report that says the host
serves, and goes on watching: a watch that ended there would miss what happens until the next.

A broken stream or a silent one is followed by one probe (`probe_host`): a TCP connection, a TLS
handshake that verifies the server as this very host, then HostInfo. The same incarnation
answering means the stream alone failed, and the watch reconnects; a server whose certificate is
not the host's (the dead host's port taken by another process) is no more the host than another
incarnation is. A registration that served in one report
and is gone (or not ready) in the next is signalled to its Run at once (`registration_lost`); the
Run decides whether that concerns it. Every watch request names the gateways' current heartbeat
addresses (those this worker was started with), so the host's heartbeats follow the gateways.

The watch asks for losses: the host itself reports each registration that stopped serving, with
its Run's identity, numbered in a journal (runtime/watch.py), so the watch keeps nothing per
registration (a Ready Run costs the worker no memory here) and only its place in the journal. A
report whose sequence is not the previous one's plus one means one was missed: the watch
reconnects and resumes after the last loss it took, so a broken stream misses none the host still
holds (one away for longer than the host's journal is told so, and leaves the rest to the
reconciler). A watch that renews (WatchResult.lostAfter, which its HostWorkflow passes to the
next watch and carries across continue-as-new) or is retried (the position in its heartbeat
details) resumes after the place the one before it left, so a loss while none watched is told.

A host that does not report losses (an older version) is watched by deltas: the watch asks for
deltas (after a stream's first report, every registration, each report holds only the
registrations that changed and the ids of those removed), keeps the whole picture itself, and
finds the losses by comparing; after a missed report the new stream's first report is whole
again. A host that does not know deltas sends whole reports (`delta` unset), taken as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from kruntimes.activities.hosts._rpc import Handshake, HostRpcError, handshake, host_channel
from kruntimes.api.ids import Namespace, RunUid
from kruntimes.api.names import validate_dns1123_label, validate_run_uid
from kruntimes.contracts.host import WatchInput, WatchReady, WatchResult
from kruntimes.contracts.names import SIGNAL_REGISTRATION_LOST, SIGNAL_WATCH_READY, run_workflow_id
from kruntimes.contracts.run import RegistrationLostSignal
from kruntimes.decisions.hostlife import LossReason, Probe, Registered, WatchRules, registration_losses
from kruntimes.pki import Identity
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

HEARTBEAT_EVERY_S = 1.0  # the activity's own heartbeat, whatever the host does
# A report's losses the watch acts on: a host's journal holds 1,024 (runtime/watch.py), so a
# report with more is not a host's; past these, the reconciler finds the Runs.
MAX_LOSSES = 1024
SILENT = "no report"
MISSED = "a report was missed"


@dataclass
class _Seen:
    """What one watch has seen of its host so far."""

    reported: bool = False
    told_ready: bool = False
    reconnects: int = 0
    not_serving_since: float | None = None
    previous: dict[str, Registered] | None = None  # every registration the host reported, by id
    sequence: int = 0  # of the current stream's last report
    # In the journal of a host that reports losses: the last position taken, and whether there
    # is one to resume after (the watch's first stream has none).
    lost_position: int = 0
    resume: bool = False


def registered(report: pb.HostReport) -> dict[str, Registered]:
    """The report's registrations by id (a watch keeps one per Run on its host: the namespace's
    string is shared, not one copy each)."""
    return {
        r.registration_id: Registered(
            registration_id=r.registration_id,
            run_uid=RunUid(r.run_uid),
            attempt=r.attempt,
            namespace=Namespace(sys.intern(r.namespace)),
            name=r.name,
            ready=r.phase == pb.REGISTRATION_PHASE_READY,
        )
        for r in report.registrations
    }


# What a host may call a registration it lost: its id is opaque, but short.
MAX_REGISTRATION_ID = 256


def _names_a_run(run_uid: str, registration_id: str, namespace: str, name: str) -> bool:
    """Whether a lost registration a host reports names a Run the way a Run is named (a host is
    trusted about its own Runs, and a Run ignores a loss of another host's; this keeps what a
    broken or hostile host sends out of workflow ids and Temporal's history)."""
    try:
        validate_run_uid(run_uid)
        validate_dns1123_label(namespace, field="namespace")
        validate_dns1123_label(name, field="name")
    except ValueError:
        return False
    return 0 < len(registration_id) <= MAX_REGISTRATION_ID and registration_id.isprintable()


SignalRun = Callable[[str, RegistrationLostSignal], Awaitable[None]]
# Tell a HostWorkflow (by workflow id) that its host serves.
SignalReady = Callable[[str, WatchReady], Awaitable[None]]


def signal_run_with(client: Client) -> SignalRun:
    """Send `registration_lost` to a Run's workflow by id; a Run that is gone is left alone."""

    async def signal(workflow_id: str, lost: RegistrationLostSignal) -> None:
        try:
            await client.get_workflow_handle(workflow_id).signal(SIGNAL_REGISTRATION_LOST, lost)
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            log.info("the Run of a lost registration is gone", extra={"run_uid": lost.runUid})

    return signal


def signal_ready_with(client: Client) -> SignalReady:
    async def signal(workflow_id: str, ready: WatchReady) -> None:
        await client.get_workflow_handle(workflow_id).signal(SIGNAL_WATCH_READY, ready)

    return signal


def _resume_after(input: WatchInput) -> int | None:
    """The journal position to resume after: the last one an earlier attempt of this watch
    heartbeated, else where the previous watch left it (WatchInput.lostAfter), else none."""
    details = activity.info().heartbeat_details
    if details and isinstance(details[0], int) and not isinstance(details[0], bool) and details[0] >= 0:
        return details[0]
    return input.lostAfter


def _identity(input: WatchInput) -> Identity:
    return Identity.host(runtime=input.runtime, host_id=input.hostId)


class HostWatchActivities:
    def __init__(
        self, *, signal_run: SignalRun, signal_ready: SignalReady, gateways: list[str] | None = None
    ) -> None:
        self.signal_run = signal_run
        self.signal_ready = signal_ready
        # The gateways' heartbeat addresses this worker knows; None: leave the host's alone.
        self.gateways = gateways

    def _request(self, interval_s: float, seen: _Seen) -> pb.WatchHostRequest:
        request = pb.WatchHostRequest(
            interval_ms=max(1, round(interval_s * 1000)),
            deltas=True,
            losses=True,
            resume=seen.resume,
            lost_after=seen.lost_position,
        )
        if self.gateways:
            request.gateways.extend(self.gateways)
            request.set_gateways = True
        return request

    @activity.defn(name="watch_host")
    async def watch_host(self, input: WatchInput) -> WatchResult:
        state = _Seen()
        after = _resume_after(input)
        if after is not None:
            state.lost_position, state.resume = after, True
        beat = asyncio.create_task(self._heartbeat(state))
        try:
            result = await self._watch(input, state)
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
        return result._replace(lostAfter=state.lost_position) if state.resume else result

    async def _heartbeat(self, state: _Seen) -> None:
        """Alive, with the journal's position: a retry of this watch (its worker died, say)
        resumes after it."""
        while True:
            activity.heartbeat(*((state.lost_position,) if state.resume else ()))
            await asyncio.sleep(HEARTBEAT_EVERY_S)

    async def _watch(self, input: WatchInput, state: _Seen) -> WatchResult:
        rules = WatchRules(interval_s=input.intervalSeconds)
        deadline = time.monotonic() + input.maxSeconds
        unanswered = 0  # probes in a row that got no answer
        while True:
            # A channel per stream: one that just failed would refuse calls while it backs off.
            # Verified as exactly this host: it is told the gateways and trusted about its Runs.
            async with host_channel(input.address, host=_identity(input)) as channel:
                outcome = await self._stream(
                    pb_grpc.FunctionRuntimeStub(channel), input, rules, deadline, state
                )
            if isinstance(outcome, WatchResult):
                return outcome
            probe = await probe_host(
                input.address, input.hostUid, host=_identity(input), timeout_s=rules.probe_timeout_s
            )
            if probe is Probe.Same:
                state.reconnects += 1
            unanswered = unanswered + 1 if probe is Probe.NoAnswer else 0
            loss = rules.after_probe(
                probe, silent=outcome.startswith(SILENT), reported=state.reported, reconnects=state.reconnects
            )
            if loss is not None:
                return WatchResult(verdict="Lost", reason=loss, message=f"{outcome}; probe: {probe}")
            log.info(
                "host watch reconnects", extra={"host": input.hostId, "problem": outcome, "probe": probe}
            )
            # A probe may come back at once (a connection closed halfway): reconnect at a pace.
            if probe is Probe.Same or unanswered:
                await asyncio.sleep(min(0.05 * max(state.reconnects, unanswered), rules.probe_timeout_s))

    async def _stream(
        self,
        stub: pb_grpc.FunctionRuntimeAsyncStub,
        input: WatchInput,
        rules: WatchRules,
        deadline: float,
        seen: _Seen,
    ) -> WatchResult | str:
        """Read reports until a verdict (returned) or a problem with the stream (its text)."""
        call = stub.WatchHost(self._request(input.intervalSeconds, seen))
        seen.sequence = 0  # a new stream numbers its reports from 1
        try:
            while True:
                wait = min(rules.silence_s, deadline - time.monotonic())
                if wait <= 0:
                    return WatchResult(verdict="Renew")
                report = await _read(call, wait)
                if report is None:
                    if time.monotonic() >= deadline:
                        return WatchResult(verdict="Renew")
                    return f"{SILENT} for {rules.silence_s:g}s"
                if report is grpc.aio.EOF:
                    return "the stream ended"
                assert isinstance(report, pb.HostReport)
                verdict = await self._report(input, rules, seen, report)
                if verdict is not None:
                    return verdict
        except grpc.aio.AioRpcError as err:
            return f"the stream failed: {err.code().name}"
        finally:
            call.cancel()

    async def _report(
        self, input: WatchInput, rules: WatchRules, seen: _Seen, report: pb.HostReport
    ) -> WatchResult | str | None:
        """What one report means: a verdict, a problem with the stream (its text: the watch
        reconnects), or None to read on."""
        if report.host_uid != input.hostUid:
            return WatchResult(
                verdict="Lost",
                reason=LossReason.Replaced,
                message=f"{input.address} reports host {report.host_uid}",
            )
        seen.reported = True
        now = time.monotonic()
        if report.health.serving:
            seen.not_serving_since = None
            seen.reconnects = 0
            if input.tellReady and not seen.told_ready:
                await self._tell_ready(input, seen)
        elif seen.not_serving_since is None:
            seen.not_serving_since = now
        elif rules.not_serving_too_long(since=seen.not_serving_since, now=now):
            return WatchResult(
                verdict="Lost",
                reason=LossReason.NotServing,
                message=report.health.message or "the host reports that it does not serve",
            )
        if report.reports_losses:
            return await self._reported_losses(input, seen, report)
        if report.delta and (seen.previous is None or report.sequence != seen.sequence + 1):
            return f"{MISSED}: {report.sequence} after {seen.sequence}"
        seen.sequence = report.sequence
        if not report.delta:
            current = registered(report)
            if seen.previous is not None:
                await self._losses(input, seen.previous, current)
            seen.previous = current
            return None
        assert seen.previous is not None
        changed = registered(report)
        touched = [*changed, *report.removed]
        before = {i: seen.previous[i] for i in touched if i in seen.previous}
        for reg_id in report.removed:
            seen.previous.pop(reg_id, None)
        seen.previous.update(changed)
        await self._losses(input, before, {i: seen.previous[i] for i in touched if i in seen.previous})
        return None

    async def _reported_losses(self, input: WatchInput, seen: _Seen, report: pb.HostReport) -> str | None:
        """Tell the Runs of the losses a host reports; a problem with the stream (its text), or
        None to read on."""
        if report.sequence != seen.sequence + 1:
            return f"{MISSED}: {report.sequence} after {seen.sequence}"
        seen.sequence = report.sequence
        if report.lost_truncated:
            log.warning(
                "the host no longer holds every registration lost while the watch was away; "
                "the reconciler finds their Runs",
                extra={"host": input.hostId, "after": seen.lost_position},
            )
        if len(report.lost) > MAX_LOSSES:
            log.warning(
                "a report names more lost registrations than a host keeps; the reconciler finds the rest",
                extra={"host": input.hostId, "lost": len(report.lost)},
            )
        for loss in report.lost[:MAX_LOSSES]:
            reg = loss.registration
            run_uid, namespace = RunUid(reg.run_uid), Namespace(reg.namespace)  # checked by _tell_lost
            await self._tell_lost(input, run_uid, reg.registration_id, namespace, reg.name, gone=loss.gone)
        seen.lost_position = report.lost_position
        seen.resume = True
        return None

    async def _tell_ready(self, input: WatchInput, seen: _Seen) -> None:
        try:
            await self.signal_ready(
                activity.info().workflow_id or "",
                WatchReady(hostUid=input.hostUid, message="the host reported that it serves"),
            )
        except Exception as err:  # told at the next report
            log.warning("cannot tell the host's workflow it serves", extra={"error": type(err).__name__})
        else:
            seen.told_ready = True

    async def _losses(
        self, input: WatchInput, previous: dict[str, Registered], current: dict[str, Registered]
    ) -> None:
        for loss in registration_losses(previous, current):
            reg = loss.registration
            gone = loss.because != "NotReady"
            await self._tell_lost(input, reg.run_uid, reg.registration_id, reg.namespace, reg.name, gone=gone)

    async def _tell_lost(
        self,
        input: WatchInput,
        run_uid: RunUid,
        registration_id: str,
        namespace: Namespace,
        name: str,
        *,
        gone: bool,
    ) -> None:
        """Signal a lost registration to its Run; one whose names are not a Run's is told to nobody."""
        if not _names_a_run(run_uid, registration_id, namespace, name):
            log.warning("a lost registration names no Run", extra={"host": input.hostId})
            return
        signal = RegistrationLostSignal(
            runUid=run_uid,
            hostUid=input.hostUid,
            registrationId=registration_id,
            reason="Unregistered" if gone else "NotReady",
            message=f"host {input.hostId} reports registration {registration_id} "
            f"{'gone' if gone else 'not ready'}",
        )
        try:
            await self.signal_run(run_workflow_id(namespace, name), signal)
        except Exception as err:  # the watch goes on; the reconciler finds what this misses
            log.warning(
                "cannot tell a Run its registration is lost",
                extra={"run_uid": run_uid, "error": type(err).__name__},
            )


async def _read(call: Any, timeout_s: float) -> Any:
    """The stream's next message, or None after `timeout_s`. Cancelling a grpc.aio read does not
    end it (the read waits for the call), so the call itself is cancelled instead: on a timeout,
    and when this activity is cancelled."""
    read = asyncio.ensure_future(call.read())
    try:
        done, _ = await asyncio.wait({read}, timeout=timeout_s)
    except asyncio.CancelledError:
        call.cancel()
        read.add_done_callback(_retrieve)
        raise
    if not done:
        call.cancel()
        read.add_done_callback(_retrieve)
        return None
    return read.result()


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # seen: a cancelled call's read ends in an error nobody waits for


_PROBE_OF = {
    Handshake.Refused: Probe.Refused,
    Handshake.Stranger: Probe.Other,
    Handshake.Unfinished: Probe.NoAnswer,
}


async def probe_host(address: str, host_uid: str, *, host: Identity, timeout_s: float) -> Probe:
    """Who answers at `address`: nothing listens (Refused), nobody in time (NoAnswer: a frozen
    process still accepts connections), a server that is not host `host` (Other: its port was
    taken by another process, whose certificate does not name the host or who does not speak
    TLS), or the same or another incarnation of it (HostInfo)."""
    try:
        shook = await handshake(address, host=host, timeout_s=timeout_s)
    except HostRpcError:  # not host:port
        return Probe.NoAnswer
    if shook is not Handshake.Verified:
        return _PROBE_OF[shook]
    try:
        async with host_channel(address, host=host) as channel:
            info = await pb_grpc.FunctionRuntimeStub(channel).HostInfo(
                pb.HostInfoRequest(), timeout=timeout_s
            )
    except grpc.aio.AioRpcError:
        return Probe.NoAnswer
    return Probe.Same if info.host_uid == host_uid else Probe.Other
