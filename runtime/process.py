"""Function processes and one exchange with them.

`WarmProcess` is a python registration's long-lived process: loaded once (blocking, in a
worker thread), then one framed request/response per invocation over its control socket, with
stdout/stderr drained from pipes during the call, all driven by the host's event loop.
`run_once` starts a process for one execution (a bash invocation, or any task) and waits for it
to end (blocking). Both bound what they read and kill the process group on timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import json
import math
import os
import select
import socket
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kruntimes.api.limits import MAX_LOG_BYTES, MAX_OUTPUTS_TOTAL_BYTES
from runtime import framing
from runtime.capture import Capture
from runtime.spawner import Exit, Spawner, SpawnSpec

MAX_FRAME = MAX_OUTPUTS_TOTAL_BYTES + 64 * 1024  # outputs plus error envelopes
LOAD_TIMEOUT_S = 60.0
EXIT_GRACE_S = 2.0  # how long to wait for the zygote's exit report after a kill or EOF
POLL_TICK_S = 0.1  # how often an exchange re-checks that its process is still alive
READ_CHUNK = 65536
MAX_DRAIN_READS = 256  # one drain of the output pipes reads at most this many chunks
CLOSE_WAIT_S = 2.0  # how long a close from another thread waits for the loop to unwatch
HEADER_SIZE = framing.HEADER.size
_unpack_header = framing.HEADER.unpack_from


class Status(enum.Enum):
    SUCCEEDED = "Succeeded"
    HANDLER_ERROR = "HandlerError"
    TIMED_OUT = "Timeout"
    PROCESS_EXITED = "ProcessExited"
    INVALID_OUTPUT = "InvalidOutput"
    CANCELLED = "Cancelled"


@dataclass(slots=True)
class Outcome:
    status: Status
    outputs_json: bytes = b""
    error_type: str = ""
    error_message: str = ""
    exit_code: int = 0
    duration_us: int = 0
    stdout: Capture = field(default_factory=Capture)
    stderr: Capture = field(default_factory=Capture)


class LoadFailed(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Pump:
    """Moves bytes between the server and one process: a payload out, a frame and output in."""

    def __init__(self, *, out_fd: int, err_fd: int, stdout: Capture, stderr: Capture) -> None:
        self.readers: dict[int, Capture] = {out_fd: stdout, err_fd: stderr}
        self.open_readers = set(self.readers)
        self.poller = select.poll()
        for fd in self.readers:
            self.poller.register(fd, select.POLLIN)
        self.writer: int | None = None
        self.pending = memoryview(b"")
        self.ctl: int | None = None
        self.frame = bytearray()
        self.ctl_eof = False

    def want_frame(self, ctl: socket.socket) -> None:
        self.ctl = ctl.fileno()
        self.poller.register(self.ctl, select.POLLIN)

    def want_write(self, fd: int, data: bytes) -> None:
        self.writer, self.pending = fd, memoryview(data)
        self.poller.register(fd, select.POLLOUT | (select.POLLIN if fd == self.ctl else 0))

    @property
    def waiting(self) -> bool:
        """True while some descriptor can still wake a poll."""
        return (
            bool(self.open_readers) or self.writer is not None or (self.ctl is not None and not self.ctl_eof)
        )

    def next_frame(self) -> tuple[int, bytes] | None:
        return _pop_frame(self.frame)

    def step(self, timeout_s: float) -> None:
        for fd, events in self.poller.poll(max(timeout_s, 0.0) * 1000):
            if fd == self.writer and events & (select.POLLOUT | select.POLLERR | select.POLLHUP):
                self._write(events)
            if (
                fd == self.ctl
                and not self.ctl_eof
                and events & (select.POLLIN | select.POLLERR | select.POLLHUP)
            ):
                self._read_ctl()
            elif fd in self.open_readers:
                self._read(fd)

    def _write(self, events: int) -> None:
        assert self.writer is not None
        if self.pending and events & select.POLLOUT:
            try:
                self.pending = self.pending[os.write(self.writer, self.pending[:READ_CHUNK]) :]
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # the process closed its end or died
                self.pending = memoryview(b"")
        elif not events & select.POLLOUT:
            self.pending = memoryview(b"")
        if self.pending:
            return
        fd, self.writer = self.writer, None
        if fd == self.ctl:
            if not self.ctl_eof:
                self.poller.modify(fd, select.POLLIN)
        else:
            self.poller.unregister(fd)
            os.close(fd)  # stdin of a one-shot process: EOF after the payload

    def _read_ctl(self) -> None:
        assert self.ctl is not None
        try:
            chunk = os.read(self.ctl, READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if chunk:
            self.frame += chunk
        else:
            self.ctl_eof = True
            self.poller.unregister(self.ctl)
            if self.writer == self.ctl:
                self.writer = None

    def _read(self, fd: int) -> None:
        try:
            chunk = os.read(fd, READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        if chunk:
            self.readers[fd].feed(chunk)
        else:
            self.open_readers.discard(fd)
            self.poller.unregister(fd)

    def drain(self) -> None:
        """Read whatever the output pipes hold now, without waiting."""
        for fd in list(self.open_readers):
            while fd in self.open_readers:
                try:
                    chunk = os.read(fd, READ_CHUNK)
                except (BlockingIOError, InterruptedError):
                    break
                if not chunk:
                    self.open_readers.discard(fd)
                    self.poller.unregister(fd)
                else:
                    self.readers[fd].feed(chunk)


def _read_chunk(fd: int) -> bytes | None:
    """One read of an output pipe: None when nothing is there yet, b"" when it is closed (or broken)."""
    try:
        return os.read(fd, READ_CHUNK)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


class FrameTooLarge(Exception):
    pass


def _pop_frame(buffer: bytearray) -> tuple[int, bytes] | None:
    """Pop one complete frame; raises FrameTooLarge before buffering an oversized one."""
    if len(buffer) < framing.HEADER.size:
        return None
    size, kind = framing.HEADER.unpack_from(buffer)
    if size > MAX_FRAME:
        raise FrameTooLarge
    end = framing.HEADER.size + size
    if len(buffer) < end:
        return None
    body = bytes(buffer[framing.HEADER.size : end])
    del buffer[:end]
    return kind, body


def _error_fields(body: bytes) -> tuple[str, str]:
    try:
        raw = json.loads(body)
        return str(raw["type"]), str(raw["message"])
    except (ValueError, KeyError, TypeError):
        return "InvalidOutput", "the function process sent a malformed error"


def _set_error(outcome: Outcome, status: Status, kind: str, message: str) -> None:
    outcome.status, outcome.error_type, outcome.error_message = status, kind, message


def _apply_frame(outcome: Outcome, kind: int, body: bytes) -> None:
    if kind == framing.RESULT:
        outcome.outputs_json = body
        return
    error_type, message = _error_fields(body)
    status = Status.INVALID_OUTPUT if error_type == "InvalidOutput" else Status.HANDLER_ERROR
    _set_error(outcome, status, error_type, message)


def _too_large(outcome: Outcome) -> None:
    _set_error(
        outcome,
        Status.INVALID_OUTPUT,
        "OutputsTooLarge",
        f"result larger than {MAX_OUTPUTS_TOTAL_BYTES} bytes",
    )


def _child_pipes() -> tuple[int, int, int, int]:
    out_r, out_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    err_r, err_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    # the child's ends must block: user code expects ordinary blocking stdout/stderr
    os.set_blocking(out_w, True)
    os.set_blocking(err_w, True)
    return out_r, out_w, err_r, err_w


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

    @classmethod
    def start(cls, spawner: Spawner, spec: SpawnSpec) -> WarmProcess:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w, err_r, err_w = _child_pipes()
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
        pump = _Pump(out_fd=self.out, err_fd=self.err, stdout=Capture(), stderr=stderr)
        pump.want_frame(self.ctl)
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        try:
            while True:
                frame = pump.next_frame()
                if frame is not None:
                    if frame[0] == framing.READY:
                        self._buffer += pump.frame  # whatever followed the ready frame
                        self._pipes &= pump.open_readers
                        for fd in (self.out, self.err):
                            if fd not in self._pipes:
                                self._pipe_poll.unregister(fd)
                        return
                    raise LoadFailed(*_error_fields(frame[1]))
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
        try:
            chunk = os.read(self._ctl_fd, READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
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
                frame = _pop_frame(self._buffer)
            except FrameTooLarge:
                self._end(call, ended_by="too-large")
                return
        if frame is not None:
            self._drain(call)  # what the handler wrote before it answered
            _apply_frame(call.outcome, *frame)
            self._finish(call)

    def _on_output(self, fd: int) -> None:
        call = self._call
        if call is None:  # between invocations: left in the pipe for the next one to discard
            self._unwatch(fd)
            return
        chunk = _read_chunk(fd)
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
                chunk = _read_chunk(fd)
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
            _too_large(call.outcome)
            self._finish(call)
            return
        assert self._loop is not None
        self._ending = self._loop.create_task(self._end_slowly(call, ended_by))

    async def _end_slowly(self, call: _Exchange, ended_by: str) -> None:
        outcome = call.outcome
        try:
            if ended_by == "timeout":
                self.kill()
                await self._exited(EXIT_GRACE_S)
                self._drain(call)
                message = f"the invocation did not finish within {call.timeout_s:g}s"
                _set_error(outcome, Status.TIMED_OUT, "Timeout", message)
            else:
                outcome.exit_code = await self._exited(EXIT_GRACE_S) or 0
                self._drain(call)
                _set_error(
                    outcome,
                    Status.PROCESS_EXITED,
                    "ProcessExited",
                    f"the function process exited (code {outcome.exit_code})",
                )
        finally:
            self._finish(call)

    async def _exited(self, timeout_s: float) -> int | None:
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


def run_once(
    spawner: Spawner,
    spec: SpawnSpec,
    data: bytes,
    timeout_s: float,
    *,
    stdout_limit: int = MAX_LOG_BYTES,
    on_start: Callable[[int], None] | None = None,
) -> Outcome:
    """Start a process, give it `data` (python: one framed call; exec: stdin), wait for its end.

    `on_start` receives the pid (for cancellation); the caller's kill ends the run early.
    """
    started = time.monotonic()
    outcome = Outcome(Status.SUCCEEDED, stdout=Capture(stdout_limit))
    out_r, out_w, err_r, err_w = _child_pipes()
    ctl: socket.socket | None = None
    if spec.kind == "exec":
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(in_w, False)
        child_fds = [in_r, out_w, err_w]
    else:
        ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ctl.setblocking(False)
        in_r, in_w = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1
        child_fds = [in_r, out_w, err_w, theirs.fileno()]
    try:
        pid, exit = spawner.spawn(spec, child_fds)
    except Exception:
        for fd in (out_r, err_r, in_w):
            if fd >= 0:
                os.close(fd)
        if ctl is not None:
            ctl.close()
        raise
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        if ctl is not None:
            theirs.close()
    if on_start is not None:
        on_start(pid)
    pump = _Pump(out_fd=out_r, err_fd=err_r, stdout=outcome.stdout, stderr=outcome.stderr)
    try:
        if ctl is None:
            pump.want_write(in_w, data)
            _wait_exec(pump, exit, started + timeout_s)
        else:
            pump.want_frame(ctl)
            _call_once(pump, ctl, outcome, data, started + timeout_s)
    except FrameTooLarge:
        _too_large(outcome)
    except TimeoutError:
        _set_error(outcome, Status.TIMED_OUT, "Timeout", f"did not finish within {timeout_s:g}s")
    finally:
        spawner.kill(pid)  # the process, or whatever it left running in its group
        exit.wait(EXIT_GRACE_S)
        pump.drain()
        for fd in (out_r, err_r):
            os.close(fd)
        if pump.writer is not None and pump.writer != pump.ctl:
            os.close(pump.writer)
        if ctl is not None:
            ctl.close()
        outcome.duration_us = int((time.monotonic() - started) * 1e6)
    if outcome.status is Status.TIMED_OUT:
        outcome.exit_code = exit.code if exit.code is not None else -9
    elif ctl is None:
        outcome.exit_code = exit.code if exit.code is not None else -9
        if outcome.exit_code != 0 and outcome.status is Status.SUCCEEDED:
            _set_error(
                outcome,
                Status.HANDLER_ERROR,
                "NonZeroExit",
                f"the script exited with code {outcome.exit_code}",
            )
    else:
        outcome.exit_code = 0 if outcome.status is Status.SUCCEEDED else 1
    return outcome


def _wait_exec(pump: _Pump, exit: Exit, deadline: float) -> None:
    """Until the process has exited and its output pipes are closed (or it exited a tick ago)."""
    while not (exit.done and not pump.open_readers):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        if exit.done:  # exited, but something it started still holds the pipes
            pump.step(min(remaining, POLL_TICK_S))
            return
        if pump.waiting:
            pump.step(min(remaining, POLL_TICK_S))
        else:
            exit.wait(min(remaining, POLL_TICK_S))


def _call_once(pump: _Pump, ctl: socket.socket, outcome: Outcome, data: bytes, deadline: float) -> None:
    """Load the handler, send one request, take its result."""
    ready = False
    while True:
        frame = pump.next_frame()
        if frame is not None:
            if not ready and frame[0] == framing.READY:
                ready = True
                pump.want_write(ctl.fileno(), framing.encode_invoke("task", data))
                continue
            _apply_frame(outcome, *frame)
            return
        if pump.ctl_eof:
            _set_error(outcome, Status.PROCESS_EXITED, "ProcessExited", "the function process exited early")
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        pump.step(min(remaining, POLL_TICK_S))
