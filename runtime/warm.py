"""A python registration's warm function process and one exchange with it.

`WarmProcess` is loaded once (blocking, in a worker thread), then serves one framed
request/response per invocation over its control socket, with stdout/stderr drained from pipes
during the call, all driven by the host's event loop. Reads are bounded, and a timeout kills
the process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import select
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from kruntimes.runtime import framing
from kruntimes.runtime.capture import Capture
from kruntimes.runtime.framing import MAX_FRAME, FrameTooLarge, pop_frame
from kruntimes.runtime.outcome import (
    LoadFailed,
    Outcome,
    Status,
    apply_frame,
    error_fields,
    set_error,
    set_too_large,
)
from kruntimes.runtime.pipes import POLL_TICK_S, READ_CHUNK, Pump, child_pipes, read_chunk
from kruntimes.runtime.spawner import EXIT_GRACE_S, Exit, Spawner, SpawnSpec

LOAD_TIMEOUT_S = 60.0
MAX_DRAIN_READS = 256  # one drain of the output pipes reads at most this many chunks
CLOSE_WAIT_S = 2.0  # how long a close from another thread waits for the loop to unwatch
HEADER_SIZE = framing.HEADER.size
_unpack_header = framing.HEADER.unpack_from


class _NoOutput(Capture):
    """The captured output of a call that printed nothing, shared; never fed."""

    __slots__ = ()

    def feed(self, chunk: bytes) -> None:
        raise RuntimeError("the shared empty capture is read-only")


_NO_OUTPUT = _NoOutput()


class _Exchange:
    """One invocation in progress on a warm process."""

    __slots__ = ("deadline", "done", "outcome", "over", "pending", "started", "timeout_s")

    def __init__(self, done: Callable[[Outcome], None], started: float, timeout_s: float) -> None:
        self.done = done
        self.outcome = Outcome(Status.SUCCEEDED, stdout=_NO_OUTPUT, stderr=_NO_OUTPUT)
        self.started = started
        self.timeout_s = timeout_s
        self.deadline = started + timeout_s
        self.pending: memoryview | None = None  # request bytes the socket has not taken yet
        self.over = False  # the answer is settled; only the clean-up remains


class _Deadlines:
    """The deadlines of the exchanges in flight on one event loop, watched by one loop timer armed
    for the earliest (a timer per exchange costs more than the rest of its bookkeeping). Calls
    usually share a timeout, so a new one rarely moves the timer."""

    def __init__(self) -> None:
        self.calls: dict[_Exchange, WarmProcess] = {}
        self.timer: asyncio.TimerHandle | None = None
        self.armed_for = math.inf

    def add(self, call: _Exchange, process: WarmProcess) -> None:
        self.calls[call] = process
        if call.deadline < self.armed_for:
            self._arm(call.deadline)

    def _arm(self, deadline: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.armed_for = deadline
        delay = max(deadline - time.monotonic(), 0.0)
        self.timer = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        self.timer, self.armed_for = None, math.inf
        now = time.monotonic()
        expired = [(c, p) for c, p in self.calls.items() if c.deadline <= now]
        for call, _ in expired:
            del self.calls[call]
        if self.calls:
            self._arm(min(c.deadline for c in self.calls))
        for call, process in expired:
            process._on_timeout(call)


_DEADLINES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Deadlines] = weakref.WeakKeyDictionary()


def _deadlines(loop: asyncio.AbstractEventLoop) -> _Deadlines:
    deadlines = _DEADLINES.get(loop)
    if deadlines is None:
        deadlines = _DEADLINES[loop] = _Deadlines()
    return deadlines


def _resolve(future: asyncio.Future[Any], value: Any = None) -> None:
    if not future.done():
        future.set_result(value)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class WarmProcess:
    """One warm python process serving a registration's invocations, one at a time.

    Loading (`start`) blocks and runs in a worker thread. Invocations (`exchange`) run on the
    event loop that serves the host: the control socket and the output pipes are watched with
    `loop.add_reader`, so a call costs one write, one read and one poll of the pipes, with no
    thread in between. Closing from another thread hands the unwatching to the loop.
    """

    def __init__(
        self, spawner: Spawner, pid: int, exit: Exit, ctl: socket.socket, out: int, err: int
    ) -> None:
        self.spawner = spawner
        self.pid = pid
        self.exit = exit
        self.ctl = ctl
        self.out = out
        self.err = err
        self._ctl_fd = ctl.fileno()
        self._buffer = bytearray()
        self._pipes = {out, err}  # output pipes not at EOF
        self._pipe_poll = select.poll()  # drains the pipes without waiting
        for fd in self._pipes:
            self._pipe_poll.register(fd, select.POLLIN)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deadlines: _Deadlines | None = None
        self._watched: set[int] = set()  # descriptors with a reader on the loop
        self._call: _Exchange | None = None
        self._ending: asyncio.Task[None] | None = None
        self._closed = False
        self.is_async = False  # its handler is a coroutine function (its ready frame says)
        self.idle_since = 0.0  # when it was last given back idle (runtime/warm_pool.py)

    @classmethod
    def start(cls, spawner: Spawner, spec: SpawnSpec) -> WarmProcess:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w, err_r, err_w = child_pipes()
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            pid, exit = spawner.spawn(spec, [null, out_w, err_w, theirs.fileno()])
        except Exception:
            os.close(out_r)
            os.close(err_r)
            ours.close()
            raise
        finally:
            for fd in (null, out_w, err_w):
                os.close(fd)
            theirs.close()
        ours.setblocking(False)
        proc = cls(spawner, pid, exit, ours, out_r, err_r)
        proc._await_ready()
        return proc

    def _await_ready(self) -> None:
        stderr = Capture()
        pump = Pump(out_fd=self.out, err_fd=self.err, stdout=Capture(), stderr=stderr)
        pump.want_frame(self.ctl)
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        try:
            while True:
                frame = pump.next_frame()
                if frame is not None:
                    if frame[0] == framing.READY:
                        self.is_async = frame[1] == framing.READY_ASYNC
                        self._buffer += pump.frame  # whatever followed the ready frame
                        self._pipes &= pump.open_readers
                        for fd in (self.out, self.err):
                            if fd not in self._pipes:
                                self._pipe_poll.unregister(fd)
                        return
                    raise LoadFailed(*error_fields(frame[1]))
                remaining = deadline - time.monotonic()
                if pump.ctl_eof or remaining <= 0:
                    why = "timed out loading the handler" if remaining <= 0 else "exited while loading"
                    raise LoadFailed("ProcessExited", f"function process {why}: {stderr.tail_text(512)}")
                pump.step(min(remaining, POLL_TICK_S))
        except FrameTooLarge:
            self.close()
            raise LoadFailed(
                "ProcessExited", "function process sent an oversized frame while loading"
            ) from None
        except LoadFailed:
            self.close()
            raise

    @property
    def alive(self) -> bool:
        return not self.exit.done

    def hand_over(self) -> tuple[bytes, frozenset[int]]:
        """For a SharedProcess taking over its socket and pipes (before any exchange): what was
        read past the ready frame, and the output pipes still open."""
        return bytes(self._buffer), frozenset(self._pipes)

    # -- one invocation, on the event loop ---------------------------------------------------

    def exchange(
        self, invocation_id: str, payload: bytes, timeout_s: float, done: Callable[[Outcome], None]
    ) -> None:
        """Send one invocation; `done` gets its Outcome (on the loop) once the exchange is over.

        Must run on the event loop thread, one exchange at a time. Every way an exchange can end
        (an answer, a timeout, the process exiting, an oversized answer) ends in `done`.
        """
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
            self._deadlines = _deadlines(loop)
        if self._call is not None:
            raise RuntimeError("an exchange is already in progress")
        self._drain(None)  # output written between invocations belongs to none of them
        call = self._call = _Exchange(done, time.monotonic(), timeout_s)
        watched = self._watched
        if self._ctl_fd not in watched:
            loop.add_reader(self._ctl_fd, self._on_ctl)
            watched.add(self._ctl_fd)
        for fd in self._pipes:
            if fd not in watched:
                loop.add_reader(fd, self._on_output, fd)
                watched.add(fd)
        request = framing.encode_invoke(invocation_id, payload)
        try:
            written = os.write(self._ctl_fd, request)
        except (BlockingIOError, InterruptedError):
            written = 0
        except OSError:  # the process is gone: the read sees EOF
            written = len(request)
        if written < len(request):
            call.pending = memoryview(request)[written:]
            loop.add_writer(self._ctl_fd, self._on_writable)
        assert self._deadlines is not None
        self._deadlines.add(call, self)

    async def exchange_async(self, invocation_id: str, payload: bytes, timeout_s: float) -> Outcome:
        """`exchange` for a coroutine (the slow paths); the exchange ends even if this is cancelled."""
        answered: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self.exchange(invocation_id, payload, timeout_s, functools.partial(_resolve, answered))
        return await answered

    def _unwatch(self, fd: int) -> None:
        if fd in self._watched:
            self._watched.discard(fd)
            assert self._loop is not None
            self._loop.remove_reader(fd)

    def _on_writable(self) -> None:
        call = self._call
        if call is None or call.pending is None:
            return
        try:
            call.pending = call.pending[os.write(self._ctl_fd, call.pending[:READ_CHUNK]) :]
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            call.pending = call.pending[:0]
        if not call.pending:
            call.pending = None
            assert self._loop is not None
            self._loop.remove_writer(self._ctl_fd)

    def _on_ctl(self) -> None:
        call = self._call
        if call is None or call.over:  # not ours to read: it waits for the next exchange
            self._unwatch(self._ctl_fd)
            return
        chunk = read_chunk(self._ctl_fd)
        if chunk is None:
            return
        if not chunk:
            self._unwatch(self._ctl_fd)
            self._end(call, ended_by="eof")
            return
        frame: tuple[int, bytes] | None = None
        if not self._buffer and len(chunk) >= HEADER_SIZE:  # usually the whole answer in one read
            size, kind = _unpack_header(chunk)
            if len(chunk) == HEADER_SIZE + size and size <= MAX_FRAME:
                frame = kind, chunk[HEADER_SIZE:]
        if frame is None:
            self._buffer += chunk
            try:
                frame = pop_frame(self._buffer)
            except FrameTooLarge:
                self._end(call, ended_by="too-large")
                return
        if frame is not None:
            self._drain(call)  # what the handler wrote before it answered
            apply_frame(call.outcome, *frame)
            self._finish(call)

    def _on_output(self, fd: int) -> None:
        call = self._call
        if call is None:  # between invocations: left in the pipe for the next one to discard
            self._unwatch(fd)
            return
        chunk = read_chunk(fd)
        if chunk is None:
            return
        if chunk:
            self._capture(call, fd).feed(chunk)
        else:
            self._pipe_closed(fd)

    def _capture(self, call: _Exchange, fd: int) -> Capture:
        """The call's capture of `fd`, made at its first output (most calls print nothing)."""
        outcome = call.outcome
        if fd == self.out:
            if outcome.stdout is _NO_OUTPUT:
                outcome.stdout = Capture()
            return outcome.stdout
        if outcome.stderr is _NO_OUTPUT:
            outcome.stderr = Capture()
        return outcome.stderr

    def _pipe_closed(self, fd: int) -> None:
        if fd in self._pipes:
            self._pipes.discard(fd)
            self._pipe_poll.unregister(fd)
        self._unwatch(fd)

    def _drain(self, call: _Exchange | None) -> None:
        """Read what the output pipes hold now, without waiting (into the call's captures, or away)."""
        poll = self._pipe_poll
        for _ in range(MAX_DRAIN_READS):
            if not self._pipes:
                return
            ready = poll.poll(0)
            if not ready:
                return
            for fd, _ in ready:
                chunk = read_chunk(fd)
                if chunk is None:
                    continue
                if not chunk:
                    self._pipe_closed(fd)
                elif call is not None:
                    self._capture(call, fd).feed(chunk)

    def _on_timeout(self, call: _Exchange) -> None:
        if call is self._call and not call.over:
            self._end(call, ended_by="timeout")

    def _end(self, call: _Exchange, *, ended_by: str) -> None:
        """The exchange cannot end with a frame: settle it (waiting for the process off the hot path)."""
        call.over = True
        self._forget_deadline(call)
        if ended_by == "too-large":
            self.kill()
            set_too_large(call.outcome)
            self._finish(call)
            return
        assert self._loop is not None
        self._ending = self._loop.create_task(self._end_slowly(call, ended_by))

    async def _end_slowly(self, call: _Exchange, ended_by: str) -> None:
        outcome = call.outcome
        try:
            if ended_by == "timeout":
                self.kill()
                await self.exited(EXIT_GRACE_S)
                self._drain(call)
                message = f"the invocation did not finish within {call.timeout_s:g}s"
                set_error(outcome, Status.TIMED_OUT, "Timeout", message)
            else:
                outcome.exit_code = await self.exited(EXIT_GRACE_S) or 0
                self._drain(call)
                set_error(
                    outcome,
                    Status.PROCESS_EXITED,
                    "ProcessExited",
                    f"the function process exited (code {outcome.exit_code})",
                )
        finally:
            self._finish(call)

    async def exited(self, timeout_s: float) -> int | None:
        """The exit code once the zygote has reported the exit, or None after `timeout_s`."""
        if not self.exit.done:
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()

            def wake() -> None:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                    loop.call_soon_threadsafe(_resolve, waiter)

            self.exit.on_exit(wake)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, timeout_s)
        return self.exit.code

    def _forget_deadline(self, call: _Exchange) -> None:
        if self._deadlines is not None:
            self._deadlines.calls.pop(call, None)

    def _finish(self, call: _Exchange) -> None:
        call.over = True
        self._forget_deadline(call)
        if call.pending is not None:
            call.pending = None
            assert self._loop is not None
            self._loop.remove_writer(self._ctl_fd)
        if self._call is call:
            self._call = None
        call.outcome.duration_us = int((time.monotonic() - call.started) * 1e6)
        call.done(call.outcome)

    # -- end of life -------------------------------------------------------------------------

    def kill(self) -> None:
        if self.alive:
            self.spawner.kill(self.pid)

    def _unwatch_all(self) -> None:
        loop = self._loop
        if loop is None:
            return
        for fd in list(self._watched):
            self._unwatch(fd)
        call = self._call
        if call is not None and call.pending is not None:
            call.pending = None
            loop.remove_writer(self._ctl_fd)

    def close(self) -> None:
        """Kill the process and release its descriptors (from any thread)."""
        if self._closed:
            return
        self._closed = True
        self.kill()
        loop = self._loop
        if loop is not None and (self._watched or self._call is not None):
            if _running_loop() is loop:
                self._unwatch_all()
            elif not loop.is_closed():
                unwatched = threading.Event()

                def unwatch() -> None:
                    try:
                        self._unwatch_all()
                    finally:
                        unwatched.set()

                try:
                    loop.call_soon_threadsafe(unwatch)
                except RuntimeError:  # closed meanwhile: its watchers are gone with it
                    pass
                else:
                    unwatched.wait(CLOSE_WAIT_S)
        self.ctl.close()
        for fd in (self.out, self.err):
            os.close(fd)
