"""The warm processes of one python registration.

A registration starts one warm process when it registers. Its handler decides what more it gets:
a sync handler answers one invocation at a time per process, so a registration that runs
several at once (its concurrency) starts another warm process whenever an invocation finds none
idle, up to its concurrency; an async handler's process takes them all (`SharedProcess`), so
its registration keeps that one process. Every process of a registration runs in its sandbox
(the same uid, cgroup and limits: its memory limit is across all of them).

A process start that fails while others serve (the function's process or memory limit reached)
is no failure of the invocation: it waits for a process to be given back, and no more are
started until one of the processes dies. With none serving, the failure is the registration's
(`acquire` raises). Processes idle for `IDLE_S` are ended (`sweep`), all but one.

`take`, `give_back`, `forget` and `acquire` run on the host's event loop; `first`, `sweep`,
`kill` and `close` on any thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from kruntimes.runtime.errors import FunctionNotReady
from kruntimes.runtime.outcome import LoadFailed, Outcome
from kruntimes.runtime.shared import SharedProcess
from kruntimes.runtime.spawner import SpawnError
from kruntimes.runtime.warm import WarmProcess

log = logging.getLogger(__name__)

IDLE_S = 60.0  # a registration's warm process idle for this long is ended, all but one


class Exchanger(Protocol):
    """A warm process as an invocation uses it (`WarmProcess`, `SharedProcess`)."""

    pid: int

    @property
    def alive(self) -> bool: ...

    def exchange(
        self, invocation_id: str, payload: bytes, timeout_s: float, done: Callable[[Outcome], None]
    ) -> None: ...

    def kill(self) -> None: ...

    def close(self) -> None: ...


class WarmPool:
    def __init__(self, start: Callable[[], WarmProcess], *, size: int) -> None:
        """`start` spawns a warm process and waits until its handler is loaded (blocking);
        `size` is the registration's concurrency."""
        self._start = start
        self.size = size
        self._lock = threading.Lock()
        self._all: set[Exchanger] = set()
        self._idle: list[WarmProcess] = []  # the last given back at the end
        self._shared: SharedProcess | None = None
        self._takers: deque[asyncio.Future[Exchanger | None]] = deque()  # waiting for one given back
        self._starts = 0  # processes being started for invocations
        self._ceiling = size  # lowered when a start fails while others serve
        self._starting_shared: asyncio.Future[Exchanger] | None = None
        self._mode_shared = False  # the handler is async and the concurrency above 1
        self._closed = False

    @property
    def shared(self) -> bool:
        """One process takes every invocation (an async handler's, with concurrency above 1)."""
        return self._mode_shared

    def count(self) -> int:
        with self._lock:
            return sum(1 for process in self._all if process.alive)

    def processes(self) -> list[Exchanger]:
        """Its processes that are alive (any thread)."""
        with self._lock:
            return [process for process in self._all if process.alive]

    def first(self) -> None:
        """The registration's first process (blocking; LoadFailed, SpawnError)."""
        process = self._start()
        self._add(process, idle=True)

    def _add(self, process: WarmProcess, *, idle: bool) -> Exchanger:
        """A process whose handler loaded joins the registration (any thread)."""
        with self._lock:
            closed = self._closed
            if not closed:
                if process.is_async and self.size > 1:
                    self._mode_shared = True
                    shared = self._shared = SharedProcess(process)
                    self._all.add(shared)
                    return shared
                self._all.add(process)
                if idle:
                    process.idle_since = time.monotonic()
                    self._idle.append(process)
        if closed:
            process.close()
            raise FunctionNotReady("the function is being unregistered")
        return process

    def take(self) -> Exchanger | None:
        """A process free for an invocation now (the shared one, or an idle one), or None."""
        dead: list[WarmProcess] = []
        found: Exchanger | None = None
        with self._lock:
            shared = self._shared
            if shared is not None:
                found = shared if shared.alive else None
            else:
                while self._idle:
                    process = self._idle.pop()
                    if process.alive:
                        found = process
                        break
                    self._all.discard(process)
                    dead.append(process)
        for process in dead:  # died while idle: nobody's invocation to tell
            process.close()
        return found

    async def acquire(self) -> Exchanger:
        """A process for an admitted invocation that `take` found none for: a new one started
        (or, shared, the one being started), or the first one given back when no more can be
        started. Raises what the start raised when no process of the registration serves."""
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise FunctionNotReady("the function is being unregistered")
            found = self.take()
            if found is not None:
                return found
            starting = self._starting_shared
            if starting is not None:
                await asyncio.shield(starting)  # its failure is the starter's to report
                continue
            with self._lock:
                alive = sum(1 for process in self._all if process.alive)
                start_now = (
                    self._mode_shared
                    or alive + self._starts < self._ceiling
                    or (alive == 0 and self._starts == 0)
                )
                if start_now:
                    self._starts += 1
            if not start_now:
                taker: asyncio.Future[Exchanger | None] = loop.create_future()
                self._takers.append(taker)
                given = await taker
                if given is not None:
                    return given
                continue
            start = asyncio.ensure_future(loop.run_in_executor(None, self._start_one))
            shared = self._mode_shared  # one start for all of a shared process's invocations
            if shared:
                self._starting_shared = start
            try:
                return await asyncio.shield(start)
            except asyncio.CancelledError:  # the host stops: a process started meanwhile is idle
                if not shared:
                    start.add_done_callback(self._started_for_nobody)
                raise
            except (LoadFailed, SpawnError) as exc:
                if self.count() == 0:
                    self._wake_takers()  # they fail alike, or find the registration gone
                    raise
                with self._lock:
                    self._ceiling = max(1, sum(1 for process in self._all if process.alive))
                log.warning("could not start another warm process; invocations share those running: %s", exc)
            finally:
                with self._lock:
                    self._starts -= 1
                if shared:
                    self._starting_shared = None

    def _started_for_nobody(self, start: asyncio.Future[Exchanger]) -> None:
        if not start.cancelled() and start.exception() is None:
            process = start.result()
            if process.alive:
                self.give_back(process)

    def _wake_takers(self) -> None:
        with self._lock:
            takers, self._takers = list(self._takers), deque()
        for taker in takers:
            if not taker.done():
                taker.set_result(None)

    def _start_one(self) -> Exchanger:
        return self._add(self._start(), idle=False)

    def give_back(self, process: Exchanger) -> None:
        """An invocation is done with `process`, which is alive: the next waiting for one takes
        it, else it is idle."""
        if process is self._shared:
            return
        assert isinstance(process, WarmProcess)
        with self._lock:
            while self._takers:
                taker = self._takers.popleft()
                if not taker.done():
                    taker.set_result(process)
                    return
            if self._closed:
                closed = True
            else:
                closed = False
                process.idle_since = time.monotonic()
                self._idle.append(process)
        if closed:
            process.close()

    def forget(self, process: Exchanger) -> bool:
        """`process` died (found by an invocation that ended with it): it leaves the registration,
        and an invocation waiting for a process may start one. True the first time only (a shared
        process's death ends each of its invocations)."""
        with self._lock:
            known = process in self._all
            self._all.discard(process)
            if process is self._shared:
                self._shared = None
            self._ceiling = self.size
            taker = None
            while self._takers:
                candidate = self._takers.popleft()
                if not candidate.done():
                    taker = candidate
                    break
        if taker is not None:
            taker.set_result(None)
        if known:
            process.close()
        return known

    def sweep(self, now: float) -> None:
        """End the processes idle for IDLE_S, all but one (any thread)."""
        with self._lock:
            if self._shared is not None or not self._idle:
                return
            alive = sum(1 for process in self._all if process.alive)
            stale = [p for p in self._idle if now - p.idle_since >= IDLE_S]
            if len(stale) >= alive:  # keep the one given back last
                stale = stale[:-1]
            for process in stale:
                self._idle.remove(process)
                self._all.discard(process)
        for process in stale:
            process.close()

    def kill(self) -> None:
        """Kill every process (an unregistration past its grace): their invocations end."""
        with self._lock:
            processes = list(self._all)
        for process in processes:
            process.kill()

    def close(self) -> None:
        """Kill every process and release its descriptors (any thread)."""
        with self._lock:
            self._closed = True
            processes = list(self._all)
            self._all.clear()
            self._idle.clear()
            self._shared = None
        for process in processes:
            process.close()
