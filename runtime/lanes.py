"""Lanes: where the calls of a function that starts a process per call (bash, krm) run.

A lane is a call launcher (runtime/sandbox/launcher.py) the zygote started in the function's
sandbox: a PID namespace of its own inside the function's cgroup, its view, its uid, its
limits. It takes one call at a time: the host sends it the call's stdin, stdout and stderr,
the launcher starts the entrypoint with posix_spawn, reports its end once nothing else is left
in the namespace, and the lane takes the next call. A call so costs no fork of the zygote, no
namespace, no mounts and no cgroup migration: those are paid once per lane. A Python
entrypoint's lane is the function's interpreter started once, and each call a fork of it
(runtime/sandbox/launcher.py, "A Python lane"): the interpreter's start is paid once per lane too.

A registration keeps its lanes (`Lanes`): started on demand, one at a time (a call that finds
none free while one is being started waits for whichever is free first: calls shorter than a
lane's start share a few lanes instead of each starting its own), and not at all while the
calls in use are known to end, for those waiting, sooner than a lane is known to start (moving
averages of both: a Python lane's calls take a few ms, its start tens); and with as many lanes
in use as the host has CPUs, none for calls known to keep a CPU busy (their process's CPU time
over its run time, which the launcher reports: another lane would end none sooner and its start
takes CPU from them), nor, before any call ended, until a call in use has run longer than a
lane takes to start (a burst of short calls on a new registration otherwise started a lane for
each of its first calls, each a Python interpreter's start competing with the calls); a krm
registration's first when it registers, which counts as being started until it started a
call; each ended after `LANE_IDLE_S` without a call (`sweep`), and all of them with the
registration (`close`). A lane whose call timed out, was killed, or did not end
clean (the launcher gone, stopped, or something of the call it could not end) is killed whole
— its namespace, so the call's every process — and never used again; the next call starts a
new lane.

What the calls of one lane share is what the processes of one pod share: the function's
uid, cgroup (memory, processes) and workspace; never a process, nor what a call left in the
private /tmp and /dev/shm.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from kruntimes.api.limits import MAX_LOG_BYTES
from kruntimes.runtime.capture import Capture
from kruntimes.runtime.outcome import Outcome, Status, set_error, set_exit
from kruntimes.runtime.pipes import POLL_TICK_S, Pump, child_pipes
from kruntimes.runtime.spawner import EXIT_GRACE_S, Exit, Spawner, SpawnError, SpawnSpec

LANE_IDLE_S = 10.0  # a lane with no call for this long is ended (an idle Run holds no process)
# calls whose process spends at least this share of its time on a CPU get no more lanes than
# the CPUs: past them a lane adds a start and ends no call sooner
CPU_BOUND_SHARE = 0.5
_MESSAGE = 4096
_RUN = json.dumps({"op": "run"}).encode()


class Sweepable(Protocol):
    """What ends its idle processes when asked (`Lanes`, a registration's warm processes)."""

    def sweep(self, now: float) -> None: ...


class _PastLimit(Exception):
    """The call wrote more to stdout than it may (`stop_past_limit`)."""


class _NotTaken(Exception):
    """The lane was gone before it could take the call: nothing of it started."""


@dataclass(eq=False)
class Lane:
    pid: int  # the zygote's child: the init of the lane's namespace, as the host sees it
    exit: Exit
    ctl: socket.socket
    last_call: float
    starting: bool = False  # started by a call that waits for it to start that call (`Lanes._take`)
    born: float = 0.0  # when it was spawned; 0 once it started its first call (`Lanes._ready`)
    taken: float = 0.0  # when its current call took it; 0 while it has none

    @property
    def alive(self) -> bool:
        return not self.exit.done


@dataclass
class _Call:
    started: bool = False
    code: int | None = None  # as the init of a namespace reports its function: 128 + N for signal N
    clean: bool = False
    cpu_share: float | None = None  # the CPU seconds of its process per second it ran
    gone: bool = False  # end of file from the launcher


class Lanes:
    """The lanes of one registration. Thread-safe: each call holds a lane of its own."""

    def __init__(self, spawner: Spawner, spec: SpawnSpec) -> None:
        sandbox = spec.sandbox
        if spec.kind != "exec" or sandbox is None or not (sandbox.pid_namespace and sandbox.mount_namespace):
            raise ValueError("lanes need an exec spec whose sandbox has PID and mount namespaces")
        self._spawner = spawner
        self._spec = dataclasses.replace(spec, kind="launcher")
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._idle: list[Lane] = []
        self._all: set[Lane] = set()
        self._closed = False
        self._starting = False  # a lane is being started and has not started a call yet
        self.forked = 0  # calls that were forks of a Python lane (runtime/sandbox/launcher.py)
        self._waiting = 0  # calls in `_take` waiting for a lane
        # how long a lane takes to start (spawn to its first call started) and a call to run
        # on one (taken to given back), each a moving average; None until one was seen
        self._start_s: float | None = None
        self._call_s: float | None = None
        # and the share of its time a call's process spent on a CPU (CPU seconds per second)
        self._cpu_share: float | None = None
        self._cpus = len(os.sched_getaffinity(0))  # the CPUs its calls may run on

    def count(self) -> int:
        with self._lock:
            return len(self._all)

    def run(
        self,
        data: bytes,
        timeout_s: float,
        *,
        stdout_limit: int = MAX_LOG_BYTES,
        on_start: Callable[[int], None] | None = None,
        stop_past_limit: bool = False,
    ) -> Outcome:
        """One call: `data` on stdin, wait for its end as `kruntimes.runtime.once.run_once` does for a
        process started directly (`on_start` gets the pid that kills it: its lane's). With
        `stop_past_limit`, a call that writes more than `stdout_limit` to stdout is killed then,
        with its lane (`outcome.stdout.total` says it went past): its answer is refused anyway."""
        started = time.monotonic()
        deadline = started + timeout_s
        try:
            lane = self._take(deadline)
            try:
                return self._call(lane, data, started, timeout_s, stdout_limit, on_start, stop_past_limit)
            except _NotTaken:
                self._end(lane)
            finally:
                self._started(lane)
            lane = self._take(deadline)  # once more: a lane that died idle is no call's failure
            try:
                return self._call(lane, data, started, timeout_s, stdout_limit, on_start, stop_past_limit)
            except _NotTaken:
                self._end(lane)
                raise SpawnError("the function's launcher did not take the call") from None
            finally:
                self._started(lane)
        except TimeoutError:  # no lane was free in time: nothing of the call started
            outcome = Outcome(Status.TIMED_OUT, exit_code=-9)
            set_error(outcome, Status.TIMED_OUT, "Timeout", f"did not finish within {timeout_s:g}s")
            outcome.duration_us = int((time.monotonic() - started) * 1e6)
            return outcome

    def prestart(self) -> None:
        """Start a lane now, for the first call (a krm Run is called as soon as it is Ready).
        It counts as the lane being started until it started a call: calls that find it taken
        meanwhile wait for it rather than start more (a Python lane takes tens of ms to start,
        its calls a few)."""
        with self._changed:
            self._starting = True
        self._give_back(self._start_claimed())

    def _take(self, deadline: float) -> Lane:
        """An idle lane, or a new one. One lane is started at a time, and the next only once it
        started its call: a call that waits meanwhile takes the first lane given back, so that
        calls shorter than a lane's start share a few lanes instead of each starting its own."""
        with self._changed:
            while True:
                if self._closed:
                    raise SpawnError("the function is being unregistered")
                while self._idle:
                    lane = self._idle.pop()
                    if lane.alive:
                        return lane
                    self._forget(lane)
                if not self._starting and self._worth_starting():
                    self._starting = True
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                self._waiting += 1
                try:
                    # a lane given back, a start over, or (waiting having been the better bet)
                    # the time by which a lane should have been free: look again
                    self._changed.wait(min(remaining, self._start_s or remaining))
                finally:
                    self._waiting -= 1
        return self._start_claimed()

    def _start_claimed(self) -> Lane:
        """Start the lane this caller claimed the start of (`_starting`); it holds the claim
        until it started a call (`_started`), or gives it up now if it cannot start."""
        try:
            lane = self._start()
        except BaseException:
            with self._changed:
                self._starting = False
                self._changed.notify_all()
            raise
        lane.starting = True
        return lane

    def _ready(self, lane: Lane, *, forked: bool) -> None:
        """`lane` started a call: the first time, what its start took counts (from its spawn
        to that call)."""
        with self._lock:
            self.forked += forked
            if lane.born:
                self._start_s = _average(self._start_s, time.monotonic() - lane.born)
                lane.born = 0.0

    def _worth_starting(self) -> bool:
        """(Under the lock.) Whether a call that finds no lane free should start one rather than
        wait for one of those in use: unless their calls are known to end, for the calls
        already waiting and this one, sooner than a lane is known to start (a Python lane:
        tens of ms a start, a few a call). And with a lane per CPU in use, none while calls
        are known to keep a CPU busy (`CPU_BOUND_SHARE`), nor, before any call ended, until a
        call in use has run longer than a lane takes to start: a start would cost CPU the calls
        need and end none of them sooner."""
        busy = len(self._all) - len(self._idle)
        if busy == 0:
            return True
        if busy >= self._cpus:
            if self._cpu_share is not None and self._cpu_share >= CPU_BOUND_SHARE:
                return False
            if self._call_s is None:
                now = time.monotonic()
                running = max((now - lane.taken for lane in self._all if lane.taken), default=0.0)
                return self._start_s is not None and running > self._start_s
        if self._start_s is None or self._call_s is None:
            return True
        return self._call_s * (self._waiting + 1) / busy > self._start_s

    def _started(self, lane: Lane) -> None:
        """The lane `_take` started has started its call, or will not: the next may be started."""
        with self._changed:
            if lane.starting:
                lane.starting = False
                self._starting = False
                self._changed.notify_all()

    def _start(self) -> Lane:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            pid, exit = self._spawner.spawn(self._spec, [null, null, null, theirs.fileno()])
        except BaseException:
            ours.close()
            raise
        finally:
            os.close(null)
            theirs.close()
        ours.setblocking(False)
        now = time.monotonic()
        lane = Lane(pid=pid, exit=exit, ctl=ours, last_call=now, born=now)
        with self._lock:
            self._all.add(lane)
            closed = self._closed
        if closed:  # unregistered meanwhile
            self._end(lane)
            raise SpawnError("the function is being unregistered")
        return lane

    def _give_back(self, lane: Lane) -> None:
        lane.last_call = time.monotonic()
        lane.taken = 0.0
        with self._changed:
            if not self._closed and lane.alive:
                self._idle.append(lane)
                self._changed.notify()
                return
        self._end(lane)

    def _forget(self, lane: Lane) -> None:
        """(Under the lock.)"""
        self._all.discard(lane)
        lane.ctl.close()
        if lane.starting:  # it never started a call: another may be started
            lane.starting = self._starting = False
        self._changed.notify_all()  # a waiting call may start one instead

    def _end(self, lane: Lane) -> None:
        """Kill the lane (its namespace: everything of its calls) and forget it."""
        if lane.alive:
            self._spawner.kill(lane.pid)
        with self._lock:
            if lane in self._all:
                self._forget(lane)

    def sweep(self, now: float) -> None:
        """End the lanes that had no call for `LANE_IDLE_S`."""
        with self._lock:
            stale = [lane for lane in self._idle if now - lane.last_call >= LANE_IDLE_S]
            self._idle = [lane for lane in self._idle if lane not in stale]
        for lane in stale:
            self._end(lane)

    def close(self) -> None:
        """End every lane (a call still in one ends with it) and wait for them, within bounds."""
        with self._changed:
            self._closed = True
            lanes, self._idle = list(self._all), []
            self._changed.notify_all()
        for lane in lanes:
            self._end(lane)
        deadline = time.monotonic() + EXIT_GRACE_S
        for lane in lanes:
            lane.exit.wait(max(deadline - time.monotonic(), 0.0))

    # -- one call ----------------------------------------------------------------------------

    def _call(
        self,
        lane: Lane,
        data: bytes,
        started: float,
        timeout_s: float,
        stdout_limit: int,
        on_start: Callable[[int], None] | None,
        stop_past_limit: bool = False,
    ) -> Outcome:
        taken = lane.taken = time.monotonic()
        outcome = Outcome(Status.SUCCEEDED, stdout=Capture(stdout_limit))
        out_r, out_w, err_r, err_w = child_pipes()
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(in_w, False)
        try:
            socket.send_fds(lane.ctl, [_RUN], [in_r, out_w, err_w])
        except OSError:
            for fd in (out_r, err_r, in_w):
                os.close(fd)
            raise _NotTaken from None
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)
        if on_start is not None:
            on_start(lane.pid)
        call = _Call()
        pump = Pump(out_fd=out_r, err_fd=err_r, stdout=outcome.stdout, stderr=outcome.stderr)
        pump.watch(lane.ctl.fileno())
        pump.want_write(in_w, data)
        try:
            self._wait(lane, pump, call, outcome, started + timeout_s, stop_past_limit)
        except _PastLimit:
            pass  # not clean: the lane ends below, and the call with it
        except TimeoutError:
            set_error(outcome, Status.TIMED_OUT, "Timeout", f"did not finish within {timeout_s:g}s")
        finally:
            if not call.clean:  # still running, stopped, or gone: the lane ends, and its call
                self._end(lane)
                lane.exit.wait(EXIT_GRACE_S)
            pump.drain()
            for fd in (out_r, err_r):
                os.close(fd)
            if pump.writer is not None:
                os.close(pump.writer)
            outcome.duration_us = int((time.monotonic() - started) * 1e6)
        if call.clean:
            with self._lock:
                self._call_s = _average(self._call_s, time.monotonic() - taken)
                if call.cpu_share is not None:
                    self._cpu_share = _average(self._cpu_share, call.cpu_share)
            self._give_back(lane)
        if not call.started and call.gone:  # it may have started it: not tried again
            raise SpawnError("the function's launcher ended before it started the call")
        if outcome.status is Status.TIMED_OUT:
            outcome.exit_code = lane.exit.code if lane.exit.code is not None else -9
            return outcome
        set_exit(outcome, call.code if call.code is not None else lane.exit.code)
        return outcome

    def _wait(
        self, lane: Lane, pump: Pump, call: _Call, outcome: Outcome, deadline: float, stop_past_limit: bool
    ) -> None:
        """Until the launcher reported the call's end and its output pipes are closed."""
        while not ((call.code is not None or call.gone) and not pump.open_readers):
            if call.gone and not call.started:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            pump.step(min(remaining, POLL_TICK_S))
            if stop_past_limit and outcome.stdout.total > outcome.stdout.limit:
                call.clean = False
                raise _PastLimit
            if not call.gone:
                self._read(lane, pump, call, outcome)

    def _read(self, lane: Lane, pump: Pump, call: _Call, outcome: Outcome) -> None:
        while True:
            try:
                message = lane.ctl.recv(_MESSAGE)
            except BlockingIOError:
                return
            except OSError:
                message = b""
            if not message:  # the launcher is gone: its namespace, and the call, with it
                call.gone = True
                pump.unwatch(lane.ctl.fileno())
                return
            report = json.loads(message)
            if report["op"] == "started":
                call.started = True
                self._ready(lane, forked=bool(report.get("forked")))
                self._started(lane)
            elif report["op"] == "failed":  # as a direct start reports an exec that failed
                call.started, call.code, call.clean = True, 127, True
                self._started(lane)
                outcome.stderr.feed(
                    f"kruntimes: function process failed to start: {report['error']}\n".encode()
                )
            elif report["op"] == "exited":
                code = int(report["code"])
                call.code, call.clean = (128 - code if code < 0 else code), bool(report["clean"])
                call.cpu_share = _cpu_share(report)


def _cpu_share(report: dict[str, Any]) -> float | None:
    """The share of the time a call's process ran or could have run that it spent on a CPU
    (what it waited for a CPU taken out of its run time: the same on a busy machine as on an
    idle one); None when the launcher did not say."""
    try:
        cpu, wall, delay = (float(report[key]) for key in ("cpu", "wall", "delay"))
    except (KeyError, TypeError, ValueError):
        return None
    active = max(wall - delay, cpu)
    return cpu / active if active > 0 else None


def _average(before: float | None, sample: float) -> float:
    return sample if before is None else 0.7 * before + 0.3 * sample


def sweeper(lanes: Callable[[], Iterable[Sweepable]], stop: threading.Event) -> None:
    """Every half `LANE_IDLE_S` until `stop`: end the idle lanes (and warm processes) of every
    registration."""
    while not stop.wait(LANE_IDLE_S / 2):
        now = time.monotonic()
        for each in lanes():
            with contextlib.suppress(Exception):
                each.sweep(now)
