"""How many invocations run at once: per registration (its `Gate`) and per host (`HostBound`).

A registration runs up to `concurrency` invocations at once; up to `queue` more wait their turn
in the order they came, each for at most its queue timeout (or the time left of its own timeout,
if that is less: the caller's deadline counts the wait); beyond that an invocation is refused at
once (ConcurrencyLimit), as is one that waited its longest (QueueTimeout). An invocation that ends
hands its place to the first one waiting, so a waiting invocation never competes with new ones,
nor with other registrations for the host's bound: the host's bound (`krt host
--max-invocations`) is checked only when a new invocation would start running without waiting
(HostBusy past it), and the invocations running on the host never exceed it.

What waits is bounded host-wide too (`krt host --max-waiting`, `--max-waiting-bytes`): a waiting
invocation holds its payload, so an invocation that would wait past either bound is refused at
once (HostBusy), whatever room its own queue has. A waiting invocation whose caller went away
(its future cancelled) leaves the queue at once, freeing its place and its bytes, and never runs.

Entering, leaving and expiring run on the host's event loop; `close` and `wait_idle` (an
unregistration, in a worker thread) may run on any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections import deque
from dataclasses import dataclass

from kruntimes.api.limits import (
    DEFAULT_QUEUE_TIMEOUT_SECONDS,
    MAX_FUNCTION_CONCURRENCY,
    MAX_FUNCTION_QUEUE,
    MAX_INVOKE_TIMEOUT_SECONDS,
)
from kruntimes.runtime.errors import (
    ConcurrencyLimit,
    FunctionNotReady,
    HostBusy,
    InvalidRequest,
    QueueTimeout,
)

MIB = 1024 * 1024
INVOCATIONS_PER_CPU = 64  # mostly waiting on I/O, as invoked functions mostly are
MEMORY_PER_INVOCATION = 32 * MIB  # about a warm Python process's own memory
MIN_MAX_INVOCATIONS = 16
MAX_MAX_INVOCATIONS = 1_000_000
WAITER_BYTES = 4096  # what a waiting invocation holds besides its payload (its request, future, timer)
WAITING_MEMORY_SHARE = 8  # waiting invocations may hold 1/8 of the host's memory by default
DEFAULT_WAITING_BYTES = 1024 * MIB  # the default's base when the host's memory is unknown
MIN_WAITING_BYTES = 64 * MIB
DEFAULT_MAX_WAITING = 100_000  # the default count: ten Runs' full queues
MAX_MAX_WAITING = 10_000_000
MAX_MAX_WAITING_BYTES = 1 << 50


@dataclass(frozen=True, slots=True)
class Concurrency:
    """What a registration was asked to take at once (mode.function: concurrency, queue,
    queueTimeoutSeconds), part of its immutable config. 0: the default (a concurrency of 1, or
    the host's krm concurrency for a concurrent adapter; no queue; DEFAULT_QUEUE_TIMEOUT_SECONDS)."""

    concurrency: int = 0
    queue: int = 0
    queue_timeout_s: float = 0.0

    def validate(self) -> None:
        if not 0 <= self.concurrency <= MAX_FUNCTION_CONCURRENCY:
            raise InvalidRequest(
                f"concurrency must be in [1, {MAX_FUNCTION_CONCURRENCY}], got {self.concurrency}"
            )
        if not 0 <= self.queue <= MAX_FUNCTION_QUEUE:
            raise InvalidRequest(f"queue must be in [0, {MAX_FUNCTION_QUEUE}], got {self.queue}")
        if not 0 <= self.queue_timeout_s <= MAX_INVOKE_TIMEOUT_SECONDS:
            bound = MAX_INVOKE_TIMEOUT_SECONDS
            raise InvalidRequest(f"the queue timeout must be in (0, {bound}] s, got {self.queue_timeout_s:g}")

    def gate(self, *, default_concurrency: int, bound: HostBound) -> Gate:
        return Gate(
            concurrency=self.concurrency or default_concurrency,
            queue=self.queue,
            queue_timeout_s=self.queue_timeout_s or float(DEFAULT_QUEUE_TIMEOUT_SECONDS),
            bound=bound,
        )


DEFAULTS = Concurrency()


def default_max_invocations(*, cpus: int, memory_bytes: int | None) -> int:
    """The host's bound on running invocations when none is given: INVOCATIONS_PER_CPU for each
    CPU, and no more than one per MEMORY_PER_INVOCATION of the memory the host may use."""
    bound = cpus * INVOCATIONS_PER_CPU
    if memory_bytes is not None:
        bound = min(bound, memory_bytes // MEMORY_PER_INVOCATION)
    return max(MIN_MAX_INVOCATIONS, bound)


def default_max_waiting_bytes(memory_bytes: int | None) -> int:
    """The host's bound on waiting invocations' bytes when none is given: 1/WAITING_MEMORY_SHARE
    of the memory it may use (DEFAULT_WAITING_BYTES if unknown), never below MIN_WAITING_BYTES."""
    if memory_bytes is None:
        return DEFAULT_WAITING_BYTES
    return max(MIN_WAITING_BYTES, memory_bytes // WAITING_MEMORY_SHARE)


def host_memory_bytes() -> int | None:
    """The memory this process may use: its cgroup's limit (a pod's), else the machine's."""
    limits = []
    with contextlib.suppress(OSError, ValueError):
        limits.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    with contextlib.suppress(OSError, ValueError), open("/proc/self/cgroup") as f:
        for line in f:
            hierarchy, controllers, path = line.rstrip("\n").split(":", 2)
            if hierarchy == "0" and controllers == "":
                limit = _read_limit(f"/sys/fs/cgroup{path}/memory.max")
            elif "memory" in controllers.split(","):
                limit = _read_limit(f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
            else:
                continue
            if limit is not None:
                limits.append(limit)
    return min(limits) if limits else None


def _read_limit(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": none


class HostBound:
    """Invocations running and waiting on the host, across its registrations, and their bounds:
    `limit` running; `max_waiting` waiting, holding at most `max_waiting_bytes` (each its payload
    and WAITER_BYTES)."""

    def __init__(
        self,
        limit: int,
        *,
        max_waiting: int = DEFAULT_MAX_WAITING,
        max_waiting_bytes: int = DEFAULT_WAITING_BYTES,
    ) -> None:
        if not 1 <= limit <= MAX_MAX_INVOCATIONS:
            raise ValueError(
                f"the bound on running invocations must be in [1, {MAX_MAX_INVOCATIONS}], got {limit}"
            )
        if not 0 <= max_waiting <= MAX_MAX_WAITING:
            raise ValueError(f"the bound on waiting invocations must be in [0, {MAX_MAX_WAITING}]")
        if not 0 <= max_waiting_bytes <= MAX_MAX_WAITING_BYTES:
            raise ValueError(f"the bound on waiting bytes must be in [0, {MAX_MAX_WAITING_BYTES}]")
        self.limit = limit
        self.running = 0
        self.max_waiting = max_waiting
        self.max_waiting_bytes = max_waiting_bytes
        self.waiting = 0
        self.waiting_bytes = 0
        self._lock = threading.Lock()

    def wait(self, size: int) -> bool:
        """An invocation holding `size` bytes would wait: False past either bound."""
        with self._lock:
            if self.waiting >= self.max_waiting or self.waiting_bytes + size > self.max_waiting_bytes:
                return False
            self.waiting += 1
            self.waiting_bytes += size
            return True

    def unwait(self, size: int) -> None:
        with self._lock:
            self.waiting -= 1
            self.waiting_bytes -= size

    def take(self) -> bool:
        with self._lock:
            if self.running >= self.limit:
                return False
            self.running += 1
            return True

    def give(self) -> None:
        with self._lock:
            self.running -= 1


@dataclass(eq=False, slots=True)
class _Waiter:
    future: asyncio.Future[None]
    loop: asyncio.AbstractEventLoop
    size: int  # the bytes it holds, counted in the host's bound
    timer: asyncio.TimerHandle | None = None
    own_timeout: bool = False  # its own timeout ends its wait before the queue timeout would
    gone: bool = False  # no longer waiting (expired, or its place given): skipped in the queue


class Gate:
    """The invocations of one registration: running, and waiting their turn."""

    def __init__(self, *, concurrency: int, queue: int, queue_timeout_s: float, bound: HostBound) -> None:
        self.concurrency = concurrency
        self.queue = queue
        self.queue_timeout_s = queue_timeout_s
        self.bound = bound
        self.running = 0
        self.waiting = 0
        self._queue: deque[_Waiter] = deque()  # in order; may hold waiters that are gone
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._closed = False

    def enter(self, timeout_s: float, payload_bytes: int = 0) -> asyncio.Future[None] | None:
        """An invocation arrives (on the loop): None when it runs now; else a future that is done
        when its turn comes (the place of an invocation that ended is its own now), or fails with
        QueueTimeout, or FunctionNotReady when the registration goes; cancelling it withdraws
        the invocation from the queue. Refusals raise at once."""
        with self._lock:
            if self._closed:
                raise FunctionNotReady("the function is being unregistered")
            if self.running < self.concurrency:  # nobody waits while there is room
                if not self.bound.take():
                    raise HostBusy(f"the host runs {self.bound.limit} invocations, as many as it may")
                self.running += 1
                return None
            if self.waiting >= self.queue:
                raise ConcurrencyLimit(self._full())
            size = payload_bytes + WAITER_BYTES
            if not self.bound.wait(size):
                raise HostBusy(
                    f"the host holds {self.bound.waiting} waiting invocations "
                    f"({self.bound.waiting_bytes} bytes), as many as it may"
                )
            loop = asyncio.get_running_loop()
            waiter = _Waiter(loop.create_future(), loop, size, own_timeout=timeout_s < self.queue_timeout_s)
            waiter.timer = loop.call_later(min(self.queue_timeout_s, timeout_s), self._expire, waiter)
            waiter.future.add_done_callback(functools.partial(self._withdrawn, waiter))
            self._queue.append(waiter)
            self.waiting += 1
            return waiter.future

    def _gone(self, waiter: _Waiter) -> None:
        """`waiter` waits no more (under the lock): its place and its bytes are free."""
        waiter.gone = True
        self.waiting -= 1
        self.bound.unwait(waiter.size)
        if waiter.timer is not None:
            waiter.timer.cancel()

    def _withdrawn(self, waiter: _Waiter, future: asyncio.Future[None]) -> None:
        if not future.cancelled():
            return
        with self._lock:
            if not waiter.gone:
                self._gone(waiter)
                self._queue.remove(waiter)  # O(queue), once per caller that went away

    def _full(self) -> str:
        running = "an invocation" if self.concurrency == 1 else f"{self.concurrency} invocations"
        if self.queue == 0:
            return f"the function is already running {running}"
        return f"the function is already running {running} and {self.queue} more are waiting"

    def leave(self) -> None:
        """An invocation that ran has ended (on the loop): the first one waiting takes its place."""
        with self._lock:
            while self._queue:
                waiter = self._queue.popleft()
                if waiter.gone:
                    continue
                self._gone(waiter)
                if not waiter.future.done():  # else its caller was cancelled: the next one
                    waiter.future.set_result(None)
                    return
            self.running -= 1
            self.bound.give()
            if self.running == 0:
                self._idle.notify_all()

    def _expire(self, waiter: _Waiter) -> None:
        with self._lock:
            if waiter.gone:
                return
            self._gone(waiter)
            while self._queue and self._queue[0].gone:  # expiries come mostly in order
                self._queue.popleft()
        if not waiter.future.done():
            waited = (
                "its whole timeout"
                if waiter.own_timeout
                else f"{self.queue_timeout_s:g}s (the queue timeout)"
            )
            waiter.future.set_exception(
                QueueTimeout(f"the invocation waited {waited} for its turn and did not run")
            )

    def close(self) -> None:
        """No invocation enters from now on, and those waiting are refused (any thread)."""
        with self._lock:
            self._closed = True
            waiters = [w for w in self._queue if not w.gone]
            for waiter in waiters:
                waiter.gone = True
                self.bound.unwait(waiter.size)
            self._queue.clear()
            self.waiting = 0
        for waiter in waiters:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits any more
                waiter.loop.call_soon_threadsafe(_refuse, waiter)

    def wait_idle(self, timeout_s: float | None) -> bool:
        """Until no invocation runs (any thread); False when `timeout_s` passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: self.running == 0, timeout_s)


def _refuse(waiter: _Waiter) -> None:
    if waiter.timer is not None:
        waiter.timer.cancel()
    if not waiter.future.done():
        waiter.future.set_exception(FunctionNotReady("the function is being unregistered"))
