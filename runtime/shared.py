"""A warm python process whose async handler takes several invocations at once.

It starts as every warm process does (`WarmProcess.start`: spawned, handler loaded, a ready frame
saying the handler is a coroutine function); `SharedProcess` then takes over its socket and pipes
and sends it tagged requests (runtime/framing.py): each invocation gets a tag, and the process
answers each tag whenever its task ends, with what the handler printed through sys.stdout and
sys.stderr during it. What reaches the output pipes is no invocation's and is read away.

A timeout settles its invocation at once (Timeout) and tells the process to cancel that task;
a process that has not answered the cancel within `CANCEL_GRACE_S` has its event loop blocked
(a handler that never awaits), so it is killed, and the invocations still in it end as its exit
ends them (ProcessExited). Everything runs on the host's event loop, like `WarmProcess.exchange`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kruntimes.runtime import framing
from kruntimes.runtime.capture import Capture
from kruntimes.runtime.framing import FrameTooLarge, pop_frame
from kruntimes.runtime.outcome import Outcome, Status, apply_frame, set_error, set_too_large
from kruntimes.runtime.pipes import READ_CHUNK, read_chunk
from kruntimes.runtime.spawner import EXIT_GRACE_S
from kruntimes.runtime.warm import CLOSE_WAIT_S, WarmProcess

CANCEL_GRACE_S = EXIT_GRACE_S  # a cancelled task's answer is due within this


@dataclass(eq=False, slots=True)
class _Call:
    done: Callable[[Outcome], None]
    started: float
    timeout_s: float
    timer: asyncio.TimerHandle | None = None


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _captured(part: tuple[int, bytes]) -> Capture:
    total, kept = part
    capture = Capture()
    capture.feed(kept)
    capture.total = total
    return capture


class SharedProcess:
    """The exchanges of many invocations at once with one warm process (`process`, which it owns
    from now on: closing this closes it)."""

    def __init__(self, process: WarmProcess) -> None:
        self.process = process
        self.pid = process.pid
        self.is_async = True
        self._tags = itertools.count(1)
        self._calls: dict[int, _Call] = {}
        self._cancelled: dict[int, asyncio.TimerHandle] = {}  # tags whose cancel is unanswered
        buffered, self._pipes = process.hand_over()
        self._buffer = bytearray(buffered)
        self._pending = bytearray()  # request bytes the socket has not taken yet
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd = process.ctl.fileno()
        self._watched: set[int] = set()
        self._ended = False

    @property
    def alive(self) -> bool:
        return self.process.alive and not self._ended

    @property
    def in_flight(self) -> int:
        return len(self._calls)

    def exchange(
        self, invocation_id: str, payload: bytes, timeout_s: float, done: Callable[[Outcome], None]
    ) -> None:
        """Send one invocation; `done` gets its Outcome (on the loop) once it is over. Any number
        at once (the registration's concurrency bounds them)."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        if not self._watched:
            self._watch(loop)
        tag = next(self._tags) & 0xFFFF_FFFF
        call = _Call(done, time.monotonic(), timeout_s)
        if self._ended:  # died between being taken and being called
            self._settle_exited(call, self.process.exit.code)
            return
        call.timer = loop.call_later(timeout_s, self._on_timeout, tag)
        self._calls[tag] = call
        self._send(framing.encode_tagged_invoke(tag, invocation_id, payload))

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.add_reader(self._fd, self._on_ctl)
        self._watched.add(self._fd)
        for fd in self._pipes:
            loop.add_reader(fd, self._on_output, fd)
            self._watched.add(fd)

    def _unwatch(self, fd: int) -> None:
        if fd in self._watched:
            self._watched.discard(fd)
            assert self._loop is not None
            self._loop.remove_reader(fd)

    def _send(self, data: bytes) -> None:
        if self._pending:
            self._pending += data
            return
        try:
            written = os.write(self._fd, data)
        except (BlockingIOError, InterruptedError):
            written = 0
        except OSError:  # the process is gone: the read sees EOF
            return
        if written < len(data):
            self._pending += memoryview(data)[written:]
            assert self._loop is not None
            self._loop.add_writer(self._fd, self._on_writable)

    def _on_writable(self) -> None:
        try:
            written = os.write(self._fd, self._pending[:READ_CHUNK])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            written = len(self._pending)
        del self._pending[:written]
        if not self._pending:
            assert self._loop is not None
            self._loop.remove_writer(self._fd)

    def _on_output(self, fd: int) -> None:
        chunk = read_chunk(fd)
        if chunk is not None and not chunk:
            self._unwatch(fd)

    def _on_ctl(self) -> None:
        chunk = read_chunk(self._fd)
        if chunk is None:
            return
        if not chunk:
            self._unwatch(self._fd)
            self._end(kill=False)
            return
        self._buffer += chunk
        while True:
            try:
                frame = pop_frame(self._buffer, limit=framing.MAX_ANSWER_FRAME)
            except FrameTooLarge:
                self._end(kill=True)
                return
            if frame is None:
                return
            self._answered(*frame)

    def _answered(self, kind: int, body: bytes) -> None:
        try:
            if kind != framing.ANSWER:
                raise ValueError(f"an untagged frame ({kind})")
            answer = framing.decode_answer(body)
        except ValueError:  # the process broke the protocol: every call in it is lost
            self._end(kill=True)
            return
        overdue = self._cancelled.pop(answer.tag, None)
        if overdue is not None:
            overdue.cancel()
        call = self._calls.pop(answer.tag, None)
        if call is None:  # a cancelled call's late answer: answered already
            return
        outcome = Outcome(Status.SUCCEEDED, stdout=_captured(answer.out), stderr=_captured(answer.err))
        if len(answer.body) > framing.MAX_FRAME:
            set_too_large(outcome)
        else:
            apply_frame(outcome, answer.kind, answer.body)
        self._finish(call, outcome)

    def _finish(self, call: _Call, outcome: Outcome) -> None:
        if call.timer is not None:
            call.timer.cancel()
        outcome.duration_us = int((time.monotonic() - call.started) * 1e6)
        call.done(outcome)

    def _on_timeout(self, tag: int) -> None:
        call = self._calls.pop(tag, None)
        if call is None:
            return
        call.timer = None
        if self.alive:
            self._send(framing.encode(framing.CANCEL, framing.TAG.pack(tag)))
            assert self._loop is not None
            self._cancelled[tag] = self._loop.call_later(CANCEL_GRACE_S, self._cancel_overdue, tag)
        outcome = Outcome(Status.TIMED_OUT, exit_code=-9)
        set_error(
            outcome, Status.TIMED_OUT, "Timeout", f"the invocation did not finish within {call.timeout_s:g}s"
        )
        self._finish(call, outcome)

    def _cancel_overdue(self, tag: int) -> None:
        """The process did not answer a cancel: its loop is blocked, so are all its calls."""
        if self._cancelled.pop(tag, None) is not None:
            self.process.kill()

    def _end(self, *, kill: bool) -> None:
        """The process is gone (or broke the protocol and is killed): every call in it ends once
        its exit is known."""
        if self._ended:
            return
        self._ended = True
        if kill:
            self.process.kill()
        for timer in self._cancelled.values():
            timer.cancel()
        self._cancelled.clear()
        assert self._loop is not None
        self._loop.create_task(self._end_slowly())

    async def _end_slowly(self) -> None:
        code = await self.process.exited(EXIT_GRACE_S)
        calls, self._calls = list(self._calls.values()), {}
        for call in calls:
            self._settle_exited(call, code)

    def _settle_exited(self, call: _Call, code: int | None) -> None:
        outcome = Outcome(Status.PROCESS_EXITED, exit_code=code or 0)
        set_error(
            outcome, Status.PROCESS_EXITED, "ProcessExited", f"the function process exited (code {code or 0})"
        )
        self._finish(call, outcome)

    def kill(self) -> None:
        self.process.kill()

    def close(self) -> None:
        """Kill the process and release its descriptors (from any thread): the loop stops
        watching them first."""
        self.process.kill()
        loop = self._loop
        if loop is not None and self._watched and not loop.is_closed():
            if _running_loop() is loop:
                self._unwatch_all()
            else:
                unwatched = threading.Event()

                def unwatch() -> None:
                    try:
                        self._unwatch_all()
                    finally:
                        unwatched.set()

                with contextlib.suppress(RuntimeError):  # closed meanwhile: its readers with it
                    loop.call_soon_threadsafe(unwatch)
                    unwatched.wait(CLOSE_WAIT_S)
        self.process.close()

    def _unwatch_all(self) -> None:
        for fd in list(self._watched):
            self._unwatch(fd)
        if self._pending:
            self._pending.clear()
            assert self._loop is not None
            self._loop.remove_writer(self._fd)
