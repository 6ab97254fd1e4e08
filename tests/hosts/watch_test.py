"""The supervision stream against real host processes: what a host reports on WatchHost, how the
watch activity tells a dead, frozen or replaced host from a stream that merely broke, the Runs it
tells of registrations that went away, the gateways it points the host's heartbeats at, and the
process provider's fence of a lost host."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import os
import signal
import socket
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Generic, TypeVar

import pytest
from temporalio.testing import ActivityEnvironment

from kruntimes.activities.host_watch import HostWatchActivities, _Seen, probe_host
from kruntimes.activities.hosts import CreatedHost, ProcessProvider
from kruntimes.activities.hosts.process import work_root
from kruntimes.contracts.host import WatchInput, WatchReady, WatchResult
from kruntimes.contracts.run import RegistrationLostSignal
from kruntimes.decisions.hostlife import LossReason, Probe, WatchRules
from kruntimes.gateway.heartbeats import HeartbeatServer
from kruntimes.gateway.routes import RouteCache
from kruntimes.pki import Identity
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from tests.hosts.conftest import gone, killed_host, spec
from tests.support.pki import TestPKI
from tests.support.procs import alive, frozen
from tests.support.waiting import eventually, eventually_blocking

Signal = TypeVar("Signal")

INTERVAL_S = 0.3
PYTHON_0 = Identity.host(runtime="python", host_id="python-0")
BOUND_S = 30.0  # no watch here takes anywhere near this long
ECHO = "def handle(p):\n    return {'echo': p}\n"


class Told(Generic[Signal]):
    """What the watch told workflows (workflow id, signal), in order: the Runs of a lost
    registration (`Told[RegistrationLostSignal]`) or its HostWorkflow that the host is ready
    (`Told[WatchReady]`)."""

    def __init__(self) -> None:
        self.signals: list[tuple[str, Signal]] = []
        self.arrived = asyncio.Event()

    async def __call__(self, workflow_id: str, sent: Signal) -> None:
        self.signals.append((workflow_id, sent))
        self.arrived.set()


def watch_of(host: CreatedHost, *, tell_ready: bool = False, max_s: float = BOUND_S) -> WatchInput:
    return WatchInput(
        runtime=host.runtime,
        hostId=host.hostId,
        hostUid=host.hostUid,
        address=host.address,
        intervalSeconds=INTERVAL_S,
        tellReady=tell_ready,
        maxSeconds=max_s,
    )


def activities(
    *,
    told: Told[RegistrationLostSignal] | None = None,
    ready: Told[WatchReady] | None = None,
    **kw: object,
) -> HostWatchActivities:
    return HostWatchActivities(signal_run=told or Told(), signal_ready=ready or Told(), **kw)  # type: ignore[arg-type]


async def watch(
    activities: HostWatchActivities, input: WatchInput, *, beats: list[tuple[object, ...]] | None = None
) -> WatchResult:
    """The watch's result; `beats` collects the activity's heartbeats (their details) as it runs."""
    env = ActivityEnvironment()
    if beats is not None:
        env.on_heartbeat = lambda *details: beats.append(details)
    return await asyncio.wait_for(env.run(activities.watch_host, input), BOUND_S)


async def probe(host: CreatedHost, host_uid: str | None = None, *, timeout_s: float = 5) -> Probe:
    return await probe_host(
        host.address,
        host_uid or host.hostUid,
        host=Identity.host(runtime=host.runtime, host_id=host.hostId),
        timeout_s=timeout_s,
    )


def register(pki: TestPKI, host: CreatedHost, *, name: str = "fn") -> pb.RegisterFunctionResponse:
    run_uid = str(uuid.uuid4())
    signed = pki.sign(run_uid=run_uid, attempt=1, host_id=host.hostId, host_uid=host.hostUid, name=name)
    with pki.channel(host.address, as_=pki.control_plane) as channel:
        return pb_grpc.FunctionRuntimeStub(channel).RegisterFunction(
            pb.RegisterFunctionRequest(
                run=pb.RunRef(run_uid=run_uid, attempt=1, namespace="default", name=name, runtime="python"),
                assignment=signed,
                config=pb.FunctionConfig(
                    adapter="python",
                    handler="main:handle",
                    inline=pb.InlineSource(files=[pb.InlineFile(name="main.py", content=ECHO.encode())]),
                ),
            ),
            timeout=60,
        )


def unregister(pki: TestPKI, host: CreatedHost, registration_id: str) -> None:
    with pki.channel(host.address, as_=pki.control_plane) as channel:
        pb_grpc.FunctionRuntimeStub(channel).UnregisterFunction(
            pb.UnregisterFunctionRequest(registration_id=registration_id), timeout=30
        )


async def first_reports(
    pki: TestPKI, host: CreatedHost, count: int, **request: object
) -> list[pb.HostReport]:
    async with pki.aio_channel(host.address, as_=pki.control_plane) as channel:
        call = pb_grpc.FunctionRuntimeStub(channel).WatchHost(pb.WatchHostRequest(**request))  # type: ignore[arg-type]
        reports = []
        async for report in call:
            reports.append(report)
            if len(reports) == count:
                call.cancel()
                break
        return reports


async def test_a_host_reports_itself_at_once_then_every_interval_and_on_every_change(
    state_dir: Path, process: ProcessProvider, pki: TestPKI
) -> None:
    host = await process.create(spec(state_dir))
    async with pki.aio_channel(host.address, as_=pki.control_plane) as channel:
        call = pb_grpc.FunctionRuntimeStub(channel).WatchHost(pb.WatchHostRequest(interval_ms=60_000))
        first = await asyncio.wait_for(call.read(), BOUND_S)
        assert isinstance(first, pb.HostReport)
        assert (first.host_id, first.host_uid, first.runtime) == ("python-0", host.hostUid, "python")
        assert first.sequence == 1 and first.health.serving
        assert list(first.registrations) == [] and first.running_tasks == 0
        assert first.isolation["processGroup"] and "limit.open_files" in first.isolation
        # what is in force, as the host's record says it (krt status shows that)
        assert first.isolation["summary"] == host.isolation and host.isolation
        assert first.isolation["isolation"] in ("uid", "same-user")
        assert first.isolation["network"] in ("outbound", "host", "none")
        # an interval of a minute, yet a registration is reported at once
        registration = await asyncio.to_thread(register, pki, host)
        changed = await asyncio.wait_for(call.read(), BOUND_S)
        call.cancel()
    assert isinstance(changed, pb.HostReport)
    assert changed.sequence == 2 and not changed.delta  # whole: this watcher asked for no deltas
    [reg] = changed.registrations
    assert reg.registration_id == registration.registration_id
    assert reg.phase == pb.REGISTRATION_PHASE_READY and reg.in_flight == 0


async def test_a_watcher_asking_for_deltas_gets_every_registration_first_then_only_what_changed(
    state_dir: Path, process: ProcessProvider, pki: TestPKI
) -> None:
    host = await process.create(spec(state_dir))
    first = await asyncio.to_thread(register, pki, host, name="first")
    second = await asyncio.to_thread(register, pki, host, name="second")
    async with pki.aio_channel(host.address, as_=pki.control_plane) as channel:
        call = pb_grpc.FunctionRuntimeStub(channel).WatchHost(
            pb.WatchHostRequest(interval_ms=60_000, deltas=True)  # reports come only on changes
        )
        whole = await asyncio.wait_for(call.read(), BOUND_S)
        third = await asyncio.to_thread(register, pki, host, name="third")
        added = await asyncio.wait_for(call.read(), BOUND_S)
        await asyncio.to_thread(unregister, pki, host, first.registration_id)
        gone = await asyncio.wait_for(call.read(), BOUND_S)
        call.cancel()
    assert (
        isinstance(whole, pb.HostReport)
        and isinstance(added, pb.HostReport)
        and isinstance(gone, pb.HostReport)
    )
    assert not whole.delta and whole.sequence == 1
    assert {r.registration_id for r in whole.registrations} == {first.registration_id, second.registration_id}
    assert added.delta and added.sequence == 2 and not added.removed
    assert [r.registration_id for r in added.registrations] == [third.registration_id]
    assert gone.delta and gone.sequence == 3
    assert list(gone.removed) == [first.registration_id] and not gone.registrations


def _uid(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, name))


def _report(sequence: int, *names: str, delta: bool = True, removed: tuple[str, ...] = ()) -> pb.HostReport:
    return pb.HostReport(
        host_uid="uid-1",
        sequence=sequence,
        health=pb.HostHealth(serving=True),
        delta=delta,
        removed=list(removed),
        registrations=[
            pb.RegistrationState(
                run_uid=_uid(n),
                attempt=1,
                namespace="default",
                name=n,
                registration_id=f"reg-{n}",
                phase=pb.REGISTRATION_PHASE_READY,
            )
            for n in names
        ],
    )


def reader(
    told: Told[RegistrationLostSignal],
) -> tuple[HostWatchActivities, _Seen, Callable[[pb.HostReport], Awaitable[object]]]:
    """A watch of a made-up host python-0 (uid-1), what it has seen, and how it reads a report."""
    watch_activities = activities(told=told)
    input = WatchInput(
        runtime="python",
        hostId="python-0",
        hostUid="uid-1",
        address="127.0.0.1:1",
        intervalSeconds=INTERVAL_S,
        maxSeconds=BOUND_S,
    )
    rules, seen = WatchRules(interval_s=INTERVAL_S), _Seen()

    async def read(report: pb.HostReport) -> object:
        return await watch_activities._report(input, rules, seen, report)

    return watch_activities, seen, read


async def test_the_watch_keeps_the_whole_picture_from_deltas_and_reconnects_when_one_is_missed() -> None:
    told: Told[RegistrationLostSignal] = Told()
    _, seen, read = reader(told)

    assert await read(_report(1, "a", "b", delta=False)) is None
    assert await read(_report(2, "c")) is None
    assert seen.previous is not None and sorted(seen.previous) == ["reg-a", "reg-b", "reg-c"]
    assert await read(_report(3, removed=("reg-b",))) is None
    assert [(w, lost.registrationId) for w, lost in told.signals] == [("run/default/b", "reg-b")]
    assert sorted(seen.previous) == ["reg-a", "reg-c"]
    missed = await read(_report(5, "d"))  # 4 never came
    assert isinstance(missed, str) and missed.startswith("a report was missed")
    assert sorted(seen.previous) == ["reg-a", "reg-c"], "nothing of a report after a gap is taken"
    seen.sequence = 0
    assert await read(_report(1, "a", "c", "Not-A-Label", delta=False)) is None
    assert await read(_report(2, removed=("reg-Not-A-Label",))) is None
    assert len(told.signals) == 1, "a hostile name is told to nobody, in this path too"


def _losses(sequence: int, position: int, *lost: tuple[str, bool], truncated: bool = False) -> pb.HostReport:
    """A report of a host that tells its losses: `lost` (name, gone) at positions up to `position`."""
    return pb.HostReport(
        host_uid="uid-1",
        sequence=sequence,
        health=pb.HostHealth(serving=True),
        delta=sequence > 1,
        reports_losses=True,
        lost_position=position,
        lost_truncated=truncated,
        lost=[
            pb.RegistrationLoss(
                position=position - len(lost) + 1 + i,
                gone=gone,
                registration=pb.RegistrationState(
                    run_uid=_uid(n),
                    attempt=1,
                    namespace="default",
                    name=n,
                    registration_id=f"reg-{n}",
                    phase=pb.REGISTRATION_PHASE_NOT_READY,
                ),
            )
            for i, (n, gone) in enumerate(lost)
        ],
    )


async def test_a_host_that_tells_its_losses_costs_the_watch_nothing_per_registration_and_none_is_missed() -> (
    None
):
    told: Told[RegistrationLostSignal] = Told()
    watch_activities, seen, read = reader(told)

    first = watch_activities._request(INTERVAL_S, seen)
    assert first.losses and not first.resume, "the watch's first stream takes losses from now on"
    assert await read(_losses(1, 7)) is None
    assert await read(_losses(2, 9, ("a", True), ("b", False))) is None
    assert [(w, lost.runUid, lost.registrationId, lost.reason, lost.hostUid) for w, lost in told.signals] == [
        ("run/default/a", _uid("a"), "reg-a", "Unregistered", "uid-1"),
        ("run/default/b", _uid("b"), "reg-b", "NotReady", "uid-1"),
    ]
    assert seen.previous is None, "nothing is kept per registration"
    assert seen.lost_position == 9

    missed = await read(_losses(4, 10, ("c", True)))  # 3 never came
    assert isinstance(missed, str) and missed.startswith("a report was missed")
    assert len(told.signals) == 2 and seen.lost_position == 9, "nothing of a report after a gap is taken"
    again = watch_activities._request(INTERVAL_S, seen)
    assert (again.losses, again.resume, again.lost_after) == (True, True, 9), "the next stream resumes"

    seen.sequence = 0  # a new stream numbers from 1
    assert await read(_losses(1, 12, ("c", True), truncated=True)) is None
    assert told.signals[-1][0] == "run/default/c" and seen.lost_position == 12

    # what a broken or hostile host names is not a Run's: told to nobody
    hostile = _losses(2, 15, ("UPPER", True), ("d", True), ("e", True))
    hostile.lost[1].registration.namespace = "../pool"
    hostile.lost[2].registration.run_uid = "not-a-uid"
    assert await read(hostile) is None
    assert len(told.signals) == 3 and seen.lost_position == 15


async def test_a_stream_that_resumes_is_told_the_losses_of_a_host_while_nobody_watched(
    state_dir: Path, process: ProcessProvider, pki: TestPKI
) -> None:
    host = await process.create(spec(state_dir))
    kept = await asyncio.to_thread(register, pki, host, name="kept")
    removed = await asyncio.to_thread(register, pki, host, name="removed")
    [first] = await first_reports(pki, host, 1, deltas=True, losses=True)
    assert first.reports_losses and not first.lost
    await asyncio.to_thread(unregister, pki, host, removed.registration_id)
    [fresh] = await first_reports(pki, host, 1, deltas=True, losses=True)
    assert not fresh.lost, "a stream that does not resume is told losses from now on"
    [resumed] = await first_reports(
        pki, host, 1, deltas=True, losses=True, resume=True, lost_after=first.lost_position
    )
    [loss] = resumed.lost
    assert (loss.registration.registration_id, loss.registration.name, loss.gone) == (
        removed.registration_id,
        "removed",
        True,
    )
    assert loss.position == resumed.lost_position == first.lost_position + 1
    assert {r.registration_id for r in resumed.registrations} == {kept.registration_id}


async def test_the_watch_tells_ready_at_the_first_report_of_a_serving_host_and_goes_on(
    state_dir: Path, process: ProcessProvider
) -> None:
    host = await process.create(spec(state_dir))
    ready: Told[WatchReady] = Told()
    beats: list[tuple[object, ...]] = []
    watching = asyncio.create_task(
        watch(activities(ready=ready), watch_of(host, tell_ready=True), beats=beats)
    )
    try:
        await asyncio.wait_for(ready.arrived.wait(), BOUND_S)
        # Two of its heartbeats after it told ready: it watched on for a heartbeat interval at least
        # (a watch that ended stops beating and is done).
        after = len(beats) + 2
        await eventually(
            lambda: watching.done() or len(beats) >= after, within=BOUND_S, what="two heartbeats"
        )
        assert not watching.done(), "the watch goes on"
    finally:
        watching.cancel()
    [(_, told)] = ready.signals
    assert told.hostUid == host.hostUid


async def test_a_watch_renews_after_its_longest_time_while_the_host_is_well(
    state_dir: Path, process: ProcessProvider
) -> None:
    host = await process.create(spec(state_dir))
    result = await watch(activities(), watch_of(host, max_s=3 * INTERVAL_S))
    assert result.verdict == "Renew"


async def test_a_killed_host_is_lost_as_unreachable(state_dir: Path, process: ProcessProvider) -> None:
    host = await process.create(spec(state_dir))
    assert host.pid is not None
    ready: Told[WatchReady] = Told()
    watching = asyncio.create_task(watch(activities(ready=ready), watch_of(host, tell_ready=True)))
    await asyncio.wait_for(ready.arrived.wait(), BOUND_S)  # its first report in: no longer being assigned
    assert not watching.done()
    os.kill(host.pid, signal.SIGKILL)  # our own host process
    result = await watching
    assert (result.verdict, result.reason) == ("Lost", LossReason.Unreachable)


async def test_a_frozen_host_is_lost_as_silent_and_a_probe_of_it_gets_no_answer(
    state_dir: Path, process: ProcessProvider
) -> None:
    host = await process.create(spec(state_dir))
    assert host.pid is not None
    ready: Told[WatchReady] = Told()
    watching = asyncio.create_task(watch(activities(ready=ready), watch_of(host, tell_ready=True)))
    await asyncio.wait_for(ready.arrived.wait(), BOUND_S)  # its first report in: no longer being assigned
    with frozen(host.pid):
        result = await watching
        assert (result.verdict, result.reason) == ("Lost", LossReason.Silent)
        assert await probe(host, timeout_s=INTERVAL_S) is Probe.NoAnswer
    assert await probe(host) is Probe.Same
    assert await probe(host, "another-uid") is Probe.Other


async def test_a_host_frozen_before_its_first_report_is_left_to_the_stuck_timer(
    state_dir: Path, process: ProcessProvider
) -> None:
    """Until its first report a host is still being assigned: no answer is not yet a loss."""
    host = await process.create(spec(state_dir))
    assert host.pid is not None
    ready: Told[WatchReady] = Told()
    with frozen(host.pid):
        result = await watch(activities(ready=ready), watch_of(host, tell_ready=True, max_s=6 * INTERVAL_S))
    assert result.verdict == "Renew" and not ready.signals


async def test_a_registration_removed_behind_the_platforms_back_is_told_to_its_run(
    state_dir: Path, process: ProcessProvider, pki: TestPKI
) -> None:
    host = await process.create(spec(state_dir))
    kept = await asyncio.to_thread(register, pki, host, name="kept")
    removed = await asyncio.to_thread(register, pki, host, name="removed")
    told: Told[RegistrationLostSignal] = Told()
    ready: Told[WatchReady] = Told()
    watching = asyncio.create_task(watch(activities(told=told, ready=ready), watch_of(host, tell_ready=True)))
    try:
        # Its first report (both registrations) is in: the watch's stream is told losses from here.
        await asyncio.wait_for(ready.arrived.wait(), BOUND_S)
        await asyncio.to_thread(unregister, pki, host, removed.registration_id)
        await asyncio.wait_for(told.arrived.wait(), BOUND_S)
    finally:
        watching.cancel()
    [(workflow_id, lost)] = told.signals
    assert workflow_id == "run/default/removed"
    assert (lost.registrationId, lost.hostUid, lost.reason) == (
        removed.registration_id,
        host.hostUid,
        "Unregistered",
    )
    assert kept.registration_id != removed.registration_id


async def test_the_watch_points_the_hosts_heartbeats_at_the_gateways_it_knows(
    state_dir: Path, process: ProcessProvider, pki: TestPKI
) -> None:
    """A host started with a stale gateway address follows the gateway once it is watched."""
    routes = RouteCache(verifier=pki.verifier())
    gateway = HeartbeatServer(routes, "127.0.0.1:0", tls=pki.gateway)
    address = await gateway.start()
    try:
        host = await process.create(
            spec(state_dir, gateways=["127.0.0.1:9"], heartbeatIntervalSeconds=INTERVAL_S)
        )
        await asyncio.to_thread(register, pki, host)
        assert routes.hosts() == 0
        watching = asyncio.create_task(watch(activities(gateways=[address]), watch_of(host)))
        try:
            await eventually(
                lambda: routes.hosts() == 1, within=BOUND_S, every=0.05, what="the host's heartbeats"
            )
            reports = await first_reports(pki, host, 1)
        finally:
            watching.cancel()
    finally:
        await gateway.stop()
    assert [(g.address, g.connected) for g in reports[0].gateways] == [(address, True)]


async def test_the_fence_of_a_frozen_host_kills_it_and_removes_its_workspaces(
    state_dir: Path, process: ProcessProvider, pki: TestPKI
) -> None:
    host = await process.create(spec(state_dir))
    assert host.pid is not None
    await asyncio.to_thread(register, pki, host)
    workspaces = work_root(state_dir) / host.hostUid
    assert any(workspaces.iterdir())
    os.kill(host.pid, signal.SIGSTOP)
    provider = ProcessProvider(state_dir=state_dir)  # as a restarted worker: nothing remembered

    assert not await provider.gone(host)
    fenced = await provider.fence(host)

    assert fenced.fenced and "killed" in fenced.how
    assert await gone(host.pid) and not alive(host.pid)
    assert not workspaces.exists()
    assert await provider.gone(host)
    again = await provider.fence(host)
    assert again.fenced and "gone" in again.how


async def test_the_fence_of_an_older_incarnation_leaves_the_new_one_alone(
    state_dir: Path, process: ProcessProvider
) -> None:
    old = await killed_host(process, state_dir)
    new = await process.create(spec(state_dir))
    assert new.hostUid != old.hostUid and new.pid is not None

    fenced = await process.fence(old)

    assert fenced.fenced
    assert alive(new.pid) and await process.probe(new)


@pytest.mark.parametrize("address", ["127.0.0.1:1"])
async def test_a_probe_of_an_address_nobody_listens_on_is_refused(address: str) -> None:
    assert await probe_host(address, "uid", host=PYTHON_0, timeout_s=2) is Probe.Refused


# -- a stranger at a host's address ---------------------------------------------------------------
# A host's port is free once its process is gone, and any process may listen there next: it
# answers a TCP connection as the host did, and only its certificate tells it apart.

Stranger = Callable[[TestPKI, Path], "ssl.SSLContext | None"]


def _another_platforms_host(pki: TestPKI, tmp: Path) -> ssl.SSLContext:
    return TestPKI.create(tmp / "other").peer(PYTHON_0).server_context()


def _another_host_of_this_platform(pki: TestPKI, tmp: Path) -> ssl.SSLContext:
    return pki.peer(Identity.host(runtime="python", host_id="python-9")).server_context()


def _this_hosts_expired_certificate(pki: TestPKI, tmp: Path) -> ssl.SSLContext:
    return pki.expired(PYTHON_0).server_context()


def _not_tls(pki: TestPKI, tmp: Path) -> None:
    return None  # answers in plain HTTP


STRANGERS: dict[str, Stranger] = {
    "another platform's host": _another_platforms_host,
    "another host of this platform": _another_host_of_this_platform,
    "this host's expired certificate": _this_hosts_expired_certificate,
    "a server that does not speak TLS": _not_tls,
}


def listening(port: int = 0) -> socket.socket:
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock


def listening_once_free(port: int) -> socket.socket:
    """A socket listening on `port` as soon as the process that held it is gone and the kernel
    has let go of its listening socket (a moment after the process is a zombie). Blocking, so
    that no other task on the loop runs in between."""

    def bound() -> socket.socket | None:
        try:
            return listening(port)
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            return None

    sock: socket.socket = eventually_blocking(
        bound, within=BOUND_S, every=0.002, what=f"port {port} to be free"
    )
    return sock


@contextlib.asynccontextmanager
async def stranger_on(sock: socket.socket, context: ssl.SSLContext | None) -> AsyncIterator[str]:
    """A server on `sock` that is not a Runtime Server: with `context` it serves TLS with that
    certificate and holds every connection; without, it answers in HTTP."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if context is None:
            writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        with contextlib.suppress(OSError):
            await reader.read()
        writer.close()

    server = await asyncio.start_server(answer, sock=sock, ssl=context)
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("make", STRANGERS.values(), ids=STRANGERS.keys())
async def test_a_probe_answered_by_a_stranger_is_another_host(
    make: Stranger, pki: TestPKI, tmp_path: Path
) -> None:
    async with stranger_on(listening(), make(pki, tmp_path)) as address:
        assert await probe_host(address, "uid", host=PYTHON_0, timeout_s=5) is Probe.Other


async def test_a_host_whose_port_a_stranger_took_is_lost_as_replaced(
    state_dir: Path, process: ProcessProvider, pki: TestPKI, tmp_path: Path
) -> None:
    """Before, the probe took a stranger's refused handshake for no answer, and the watch
    reconnected to it for ever: the host stayed, its Runs stuck on it."""
    host = await process.create(spec(state_dir))
    assert host.pid is not None
    ready: Told[WatchReady] = Told()
    watching = asyncio.create_task(watch(activities(ready=ready), watch_of(host, tell_ready=True)))
    try:
        await asyncio.wait_for(ready.arrived.wait(), BOUND_S)  # the host reports
        port = int(host.address.rpartition(":")[2])
        context = _another_platforms_host(pki, tmp_path)
        # The kill and the stranger's bind with no await between: the watch cannot look before.
        os.kill(host.pid, signal.SIGKILL)  # our own host process
        async with stranger_on(listening_once_free(port), context):
            result = await watching
    finally:
        watching.cancel()
    assert (result.verdict, result.reason) == ("Lost", LossReason.Replaced)


def retried(position: int) -> ActivityEnvironment:
    """An environment of the watch's second attempt whose first heartbeated `position`."""
    environment = ActivityEnvironment()
    environment.info = dataclasses.replace(environment.info, attempt=2, heartbeat_details=[position])
    return environment


@pytest.mark.parametrize("how", ["the next watch", "a retried attempt"])
async def test_a_watch_resumes_where_the_previous_watch_or_attempt_left_the_journal(
    state_dir: Path, process: ProcessProvider, pki: TestPKI, how: str
) -> None:
    """A watch renews every hour, and one whose worker died is retried: a registration lost
    while no watch ran is told to the next one, which resumes after the place the previous one
    left (its WatchResult.lostAfter, passed on by the HostWorkflow; or the heartbeat of the
    attempt before)."""
    host = await process.create(spec(state_dir))
    await asyncio.to_thread(register, pki, host, name="kept")
    lost = await asyncio.to_thread(register, pki, host, name="lost")

    async def renewed_after_a_report() -> WatchResult | None:
        # (on a loaded machine a watch this short may renew before the host's first report)
        result = await watch(activities(), watch_of(host, max_s=3 * INTERVAL_S))
        assert result.verdict == "Renew"
        return result if result.lostAfter is not None else None

    first = await eventually(renewed_after_a_report, within=BOUND_S, what="a watch that took a report")
    await asyncio.to_thread(unregister, pki, host, lost.registration_id)  # while nobody watches
    told: Told[RegistrationLostSignal] = Told()
    if how == "the next watch":
        environment, input = ActivityEnvironment(), watch_of(host)._replace(lostAfter=first.lostAfter)
    else:
        environment, input = retried(first.lostAfter), watch_of(host)
    renewed = asyncio.create_task(environment.run(activities(told=told).watch_host, input))
    try:
        await asyncio.wait_for(told.arrived.wait(), BOUND_S)
    finally:
        renewed.cancel()
    [(_, loss)] = told.signals
    assert (loss.registrationId, loss.reason) == (lost.registration_id, "Unregistered")
