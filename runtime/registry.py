"""Function registrations keyed by Run UID: generations, fencing, idle clock, and how many
invocations a registration takes at once: its concurrency (1 unless its config says; a
registration of a concurrent adapter, krm, takes up to the host's `krm_concurrency`), with its
queue behind it, within the host's bound on running invocations (runtime/admission.py). What
differs between adapters is asked of the registration's adapter (runtime/adapters/host.py): a
warm adapter's registration keeps warm processes (runtime/warm_pool.py: one per invocation
running at once, or one taking them all for an async handler); one that starts a process per
call starts it in one of its lanes where its sandbox has a PID namespace (runtime/lanes.py),
and straight from the zygote otherwise."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from kruntimes.api.limits import MAX_ASYNC_BACKLOG
from kruntimes.runtime import workspace
from kruntimes.runtime.adapters.host import HostAdapter, RunOnce
from kruntimes.runtime.adapters.registered import host_adapter
from kruntimes.runtime.admission import (
    DEFAULT_MAX_WAITING,
    DEFAULTS,
    Concurrency,
    Gate,
    HostBound,
    default_max_invocations,
    default_max_waiting_bytes,
    host_memory_bytes,
)
from kruntimes.runtime.config import HandlerConfig, RunRef
from kruntimes.runtime.errors import (
    FenceMismatch,
    FunctionNotReady,
    HandlerLoadFailed,
    HandlerLoadInterrupted,
    HostUnavailable,
    InvalidRequest,
    QueueTimeout,
    RegistrationConflict,
    StaleAttempt,
    UnknownRegistration,
)
from kruntimes.runtime.isolation import Lease
from kruntimes.runtime.lanes import Lanes, Sweepable, sweeper
from kruntimes.runtime.launch import Launcher
from kruntimes.runtime.once import run_once
from kruntimes.runtime.outcome import LoadFailed, Outcome, Status, set_error
from kruntimes.runtime.sandbox.child import SandboxSpec
from kruntimes.runtime.sandbox.identity import NoFreeUid
from kruntimes.runtime.spawner import SpawnError, SpawnSpec
from kruntimes.runtime.warm import WarmProcess
from kruntimes.runtime.warm_pool import Exchanger, WarmPool
from kruntimes.system.futures import fail

log = logging.getLogger(__name__)

MAX_CONSECUTIVE_DEATHS = 5  # warm-process deaths without a completed invocation before it is fatal
DEFAULT_KRM_CONCURRENCY = 8  # invocations a registration of a concurrent adapter (krm) takes at once
MAX_KRM_CONCURRENCY = 64


class State:
    READY = "Ready"
    NOT_READY = "NotReady"
    UNREGISTERING = "Unregistering"


READY = State.READY


@dataclass(frozen=True, slots=True)
class Fence:
    run_uid: str = ""
    attempt: int = 0
    host_uid: str = ""


class FenceLike(Protocol):
    """What a caller expects of the registration (empty / 0: anything); a `Fence` or a pb.Fence."""

    @property
    def run_uid(self) -> str: ...

    @property
    def attempt(self) -> int: ...

    @property
    def host_uid(self) -> str: ...


@dataclass(frozen=True, slots=True)
class AsyncPolicy:
    """The Run's asyncInvocations bounds the host only reports (in its heartbeats'
    registrations) for the gateway to enforce: Queued invocations at most and the percent of its
    concurrency their attempts may hold. 0: not said (the gateway's own bounds)."""

    backlog: int = 0
    share: int = 0

    def validate(self) -> None:
        if not 0 <= self.backlog <= MAX_ASYNC_BACKLOG:
            raise InvalidRequest(f"async_backlog must be in [0, {MAX_ASYNC_BACKLOG}], got {self.backlog}")
        if not 0 <= self.share <= 100:
            raise InvalidRequest(f"async_share must be in [0, 100], got {self.share}")


NO_ASYNC_POLICY = AsyncPolicy()


def _now() -> datetime:
    return datetime.now(UTC)


def _resolve(future: asyncio.Future[Outcome], outcome: Outcome) -> None:
    if not future.done():  # the caller may have stopped waiting
        future.set_result(outcome)


@dataclass(eq=False)
class Registration:
    id: str
    run: RunRef
    config: HandlerConfig
    adapter: HostAdapter  # the host side of config.adapter
    digest: str
    workdir: Path
    gate: Gate  # its invocations running and waiting
    state: str = State.READY
    pool: WarmPool | None = None  # a warm adapter's processes
    fatal_error: str = ""
    deaths: int = 0
    last_activity: datetime = field(default_factory=_now)
    lease: Lease | None = None  # its identity on the host (runtime/isolation.py)
    env: dict[str, str] = field(default_factory=dict)  # its own environment, secrets resolved
    assignment: bytes = b""  # the serialized SignedAssignment it was registered with
    # the one-shot processes of the invocations in flight (a per-call adapter's): their lanes' pids
    once_pids: set[int] = field(default_factory=set)
    lanes: Lanes | None = None  # where a per-call adapter's calls run, when they run in lanes
    async_policy: AsyncPolicy = NO_ASYNC_POLICY  # reported in heartbeats, enforced by gateways

    @property
    def in_flight(self) -> int:
        """Invocations running."""
        return self.gate.running

    @property
    def waiting(self) -> int:
        """Invocations waiting their turn."""
        return self.gate.waiting

    @property
    def process(self) -> Exchanger | None:
        """A warm process of the registration that is alive, if any."""
        alive = self.pool.processes() if self.pool is not None else []
        return alive[0] if alive else None

    @property
    def sandbox(self) -> SandboxSpec | None:
        return self.lease.sandbox(self.workdir) if self.lease is not None else None


class Registry:
    def __init__(
        self,
        *,
        launcher: Launcher,
        host_uid: str,
        on_change: Callable[[], None] | None = None,
        krm_concurrency: int = DEFAULT_KRM_CONCURRENCY,
        lanes: bool = True,
        max_invocations: int | None = None,
        max_waiting: int = DEFAULT_MAX_WAITING,
        max_waiting_bytes: int | None = None,
    ) -> None:
        """`max_invocations`: the host's bound on invocations running at once, across its
        registrations (None: sized to its CPUs and memory, `default_max_invocations`);
        `max_waiting`, `max_waiting_bytes`: on those waiting their turn and the bytes they hold
        (None: a share of its memory, `default_max_waiting_bytes`)."""
        if not 1 <= krm_concurrency <= MAX_KRM_CONCURRENCY:
            raise ValueError(f"krm_concurrency must be in [1, {MAX_KRM_CONCURRENCY}], got {krm_concurrency}")
        self.krm_concurrency = krm_concurrency
        memory = host_memory_bytes() if None in (max_invocations, max_waiting_bytes) else None
        if max_invocations is None:
            max_invocations = default_max_invocations(cpus=len(os.sched_getaffinity(0)), memory_bytes=memory)
        if max_waiting_bytes is None:
            max_waiting_bytes = default_max_waiting_bytes(memory)
        self.bound = HostBound(max_invocations, max_waiting=max_waiting, max_waiting_bytes=max_waiting_bytes)
        self.launcher = launcher
        self.spawner = launcher.spawner
        self.host_uid = host_uid
        self.on_change = on_change or (lambda: None)
        self._lock = threading.Lock()
        self._by_id: dict[str, Registration] = {}
        self._by_uid: dict[str, Registration] = {}
        self._uid_locks: dict[str, threading.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # invocations that left the hot path
        self._waiting_results: set[asyncio.Future[Outcome]] = set()  # queued, not started: withdrawable
        self._closed = False
        self._fenced = False  # fence(): no registration is taken any more
        self.lanes = lanes  # per-call functions run their calls in lanes (where they can)
        self._sweeping = threading.Event()
        self._sweeper: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def _uid_lock(self, uid: str) -> threading.Lock:
        with self._lock:
            return self._uid_locks.setdefault(uid, threading.Lock())

    def register(
        self,
        run: RunRef,
        config: HandlerConfig,
        *,
        assignment: bytes = b"",
        concurrency: Concurrency = DEFAULTS,
        async_policy: AsyncPolicy = NO_ASYNC_POLICY,
    ) -> tuple[Registration, bool]:
        config.validate()
        concurrency.validate()
        async_policy.validate()
        # what the registration takes at once is part of its config: another is another config
        digest = (
            f"{config.digest()}/{concurrency.concurrency}/{concurrency.queue}/{concurrency.queue_timeout_s:g}"
        )
        with self._uid_lock(run.run_uid):
            self._check_open()
            current = self._by_uid.get(run.run_uid)
            if current is not None:
                if run.attempt < current.run.attempt:
                    raise StaleAttempt(
                        f"run {run.run_uid} is registered at attempt {current.run.attempt}; "
                        f"attempt {run.attempt} is stale"
                    )
                if run.attempt == current.run.attempt:
                    if current.digest == digest and current.run == run:
                        return current, False
                    raise RegistrationConflict(
                        f"run {run.run_uid} attempt {run.attempt} is already registered "
                        "with a different config"
                    )
                self._teardown(current, grace_s=0.0)  # a newer generation replaces it
            reg = self._create(run, config, digest, concurrency)
            reg.assignment = assignment
            reg.async_policy = async_policy
            with self._lock:
                if self._closed or self._fenced:
                    self._close_registration(reg)
                    self._check_open()
                self._by_id[reg.id] = reg
                self._by_uid[run.run_uid] = reg
        log.info(
            "function registered",
            extra={"run_uid": run.run_uid, "attempt": run.attempt, "runtime": run.runtime},
        )
        self.on_change()
        return reg, True

    def _create(
        self, run: RunRef, config: HandlerConfig, digest: str, concurrency: Concurrency
    ) -> Registration:
        adapter = host_adapter(config.adapter)
        workdir = self.launcher.workspace(f"{run.run_uid}.{run.attempt}", config)
        gate = concurrency.gate(
            default_concurrency=self.krm_concurrency if adapter.concurrent else 1, bound=self.bound
        )
        reg = Registration(
            id="reg-" + secrets.token_hex(16),
            run=run,
            config=config,
            adapter=adapter,
            digest=digest,
            workdir=workdir,
            gate=gate,
        )
        try:
            reg.env = self.launcher.env(run, config)
            reg.lease = self.launcher.identity(reg.id, workdir)
            if adapter.warm:
                reg.pool = WarmPool(functools.partial(self._start_warm, reg), size=gate.concurrency)
                reg.pool.first()
                if gate.concurrency > 1 and not reg.pool.shared:  # it may grow: its idle ones end
                    self._start_sweeper()
            else:
                self._per_call(reg)
        except LoadFailed as exc:
            self._close_registration(reg)
            failed = HandlerLoadInterrupted if exc.kind == Status.PROCESS_EXITED.value else HandlerLoadFailed
            raise failed(exc.kind, str(exc)) from exc
        except (SpawnError, NoFreeUid) as exc:
            self._close_registration(reg)
            raise HostUnavailable(str(exc)) from exc
        except BaseException:
            self._close_registration(reg)
            raise
        finally:
            # the next identity is made once this one's process is ready: preparing it (a seed
            # planted, its namespace and view built) while the function loads competes with it
            self.launcher.replenish()
        return reg

    def _per_call(self, reg: Registration) -> None:
        """A function that starts a process per call (bash, krm): the seed planted with its
        identity would wait, two processes and their memory, for as long as the Run is
        registered (500 idle bash Runs: 1,000 processes on one host). Its calls run in lanes
        started when it is called, which end when idle; or each call is started directly. A
        prestarting adapter's Run (krm: the pod evaluator's) is made to be called at once: its
        first lane is started now, from that seed, and ends like any other when idle."""
        spec = self._spec(reg, once=True)
        sandbox = spec.sandbox
        if self.lanes and sandbox is not None and sandbox.pid_namespace and sandbox.mount_namespace:
            reg.lanes = Lanes(self.spawner, spec)
            self._start_sweeper()
            if reg.adapter.prestart:
                try:
                    reg.lanes.prestart()
                except SpawnError as exc:  # its first call starts one
                    log.warning("could not start a lane ahead of the first call: %s", exc)
        if reg.lease is not None and reg.lease.group is not None:
            self.spawner.retire(reg.lease.group.procs_files)  # unused (or used) by now

    def _start_sweeper(self) -> None:
        """Idle lanes and warm processes beyond a registration's first are ended by a thread."""
        with self._lock:
            if self._sweeper is None:
                self._sweeper = threading.Thread(
                    target=sweeper, args=(self._sweepables, self._sweeping), name="sweeper", daemon=True
                )
                self._sweeper.start()

    def _sweepables(self) -> Iterable[Sweepable]:
        for reg in self.snapshot():
            if reg.lanes is not None:
                yield reg.lanes
            if reg.pool is not None and reg.gate.concurrency > 1:
                yield reg.pool

    def _start_warm(self, reg: Registration) -> WarmProcess:
        """A warm process of `reg` started and its handler loaded (blocking)."""
        return WarmProcess.start(self.spawner, self._spec(reg, once=False))

    def _spec(self, reg: Registration, *, once: bool) -> SpawnSpec:
        return self.launcher.spec(reg.run, reg.config, reg.workdir, lease=reg.lease, env=reg.env, once=once)

    def unregister(self, registration_id: str, *, grace_s: float = 5.0) -> bool:
        with self._lock:
            reg = self._by_id.get(registration_id)
        if reg is None:
            return False
        with self._uid_lock(reg.run.run_uid):
            if self._by_id.get(registration_id) is not reg:
                return False
            self._teardown(reg, grace_s=grace_s)
        self.on_change()
        return True

    def _teardown(self, reg: Registration, *, grace_s: float) -> None:
        """Stop new invokes, let those in flight finish within the grace, then kill and clean up."""
        reg.state = State.UNREGISTERING
        with self._lock:
            self._by_id.pop(reg.id, None)
            if self._by_uid.get(reg.run.run_uid) is reg:
                del self._by_uid[reg.run.run_uid]
        # Those waiting are refused; those running end within the grace, or else once every
        # process of the registration is killed.
        reg.gate.close()
        if not reg.gate.wait_idle(grace_s):
            if reg.pool is not None:
                reg.pool.kill()
            for pid in list(reg.once_pids):
                self.spawner.kill(pid)
            reg.gate.wait_idle(None)
        self._close_registration(reg)
        log.info("function unregistered", extra={"run_uid": reg.run.run_uid, "attempt": reg.run.attempt})

    def _close_registration(self, reg: Registration) -> None:
        """Kill its processes (all of them: the namespace, the cgroup or the uid), free its
        identity, remove its workspace."""
        try:
            if reg.pool is not None:
                reg.pool.close()
            if reg.lanes is not None:
                lanes, reg.lanes = reg.lanes, None
                lanes.close()
            if reg.lease is not None:
                lease, reg.lease = reg.lease, None
                self.launcher.release(lease)
        finally:
            workspace.remove(reg.workdir)

    # -- queries -----------------------------------------------------------------------------

    def get(self, registration_id: str) -> Registration | None:
        with self._lock:
            return self._by_id.get(registration_id)

    def fence(self) -> int:
        """Take no registration from now on (one in progress is refused as it would be added:
        under the same lock as the registrations' map, so none lands after this); the count of
        those held now, which stay until unregistered."""
        with self._lock:
            self._fenced = True
            return len(self._by_id)

    @property
    def fenced(self) -> bool:
        return self._fenced

    def _check_open(self) -> None:
        if self._closed:
            raise HostUnavailable("the runtime host is shutting down")
        if self._fenced:
            raise HostUnavailable("this host is fenced: it takes no registration and no task")

    def snapshot(self) -> list[Registration]:
        with self._lock:
            return list(self._by_id.values())

    # -- invocation --------------------------------------------------------------------------

    def invoke(
        self,
        registration_id: str,
        *,
        invocation_id: str,
        payload: bytes,
        timeout_s: float,
        fence: FenceLike,
    ) -> asyncio.Future[Outcome]:
        """Start an invocation, or queue it for its turn; runs on the host's event loop.

        Refusals (unknown, fence, not ready, busy: no room and no place in the queue, or the
        host's bound reached) raise at once. The returned future gets the Outcome, or a
        `RuntimeServerError`: the invocation waited its longest in the queue (QueueTimeout), the
        registration went while it waited, or its function process could not be (re)started.
        The invocation runs to its end even if nobody waits for the future any more: it holds its
        place until its process has answered, timed out or died (one whose future is cancelled
        while it waits its turn never runs). Its timeout counts its wait.
        """
        reg = self._by_id.get(registration_id)  # one dict read: atomic, no lock needed
        if reg is None:
            raise UnknownRegistration(f"no registration {registration_id!r} on this host")
        if fence.run_uid or fence.attempt or fence.host_uid:
            self._check_fence(reg, fence)
        if reg.state != READY:
            raise FunctionNotReady(reg.fatal_error or f"registration is {reg.state}")
        turn = reg.gate.enter(timeout_s, len(payload))
        reg.last_activity = _now()
        result: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        if turn is None:
            try:
                self._start(reg, invocation_id, payload, timeout_s, result)
            except BaseException:
                self._release(reg)
                raise
        else:
            waiting = functools.partial(self._queued, reg, turn, time.monotonic())
            self._waiting_results.add(result)
            self._background(waiting(invocation_id, payload, timeout_s, result))
            # withdrawn (`withdraw`: its caller went away) or failed: it leaves the queue
            result.add_done_callback(lambda _: turn.cancel())
        return result

    def withdraw(self, result: asyncio.Future[Outcome]) -> bool:
        """Withdraw the invocation `result` (from `invoke`) if it has not started: it never runs and
        its place is free at once (True). One that started is left to run to its end (False): it
        is not interrupted, since a handler stopped midway may leave its effects half done. What
        every caller that stops waiting goes through: the invoke port's cancel frame and closed
        connection, a cancelled or expired gRPC InvokeFunction (service.awaited)."""
        if result not in self._waiting_results or result.done():
            return False
        result.cancel()  # its done callback takes it out of the queue (or gives back its place)
        return True

    def _start(
        self,
        reg: Registration,
        invocation_id: str,
        payload: bytes,
        timeout_s: float,
        result: asyncio.Future[Outcome],
    ) -> None:
        """Run an admitted invocation: on a free warm process at once (the hot path: callbacks
        only), else in the background."""
        process = reg.pool.take() if reg.pool is not None else None
        if process is not None:
            done = functools.partial(self._exchanged, reg, process, result)
            process.exchange(invocation_id, payload, timeout_s, done)
        else:
            self._background(self._invoke_slowly(reg, invocation_id, payload, timeout_s, result))

    async def _queued(
        self,
        reg: Registration,
        turn: asyncio.Future[None],
        since: float,
        invocation_id: str,
        payload: bytes,
        timeout_s: float,
        result: asyncio.Future[Outcome],
    ) -> None:
        """A queued invocation: waits for its turn, then runs with what is left of its timeout."""
        try:
            await turn
        except BaseException as exc:  # QueueTimeout, the registration gone, the host stopping
            fail(result, exc)
            return
        finally:
            self._waiting_results.discard(result)  # started (below) or over: no longer withdrawn
        reg.last_activity = _now()
        if result.done():  # its caller stopped waiting while it waited: it need not run
            self._release(reg)
            return
        left = timeout_s - (time.monotonic() - since)
        try:
            if reg.state != READY:
                raise FunctionNotReady(reg.fatal_error or f"registration is {reg.state}")
            if left <= 0:
                raise QueueTimeout("the invocation waited its whole timeout for its turn and did not run")
            self._start(reg, invocation_id, payload, left, result)
        except BaseException as exc:
            self._settle(reg, result, exc)

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _release(self, reg: Registration) -> None:
        reg.last_activity = _now()
        reg.gate.leave()

    def _settle(
        self, reg: Registration, result: asyncio.Future[Outcome], end: Outcome | BaseException
    ) -> None:
        """The invocation is over: free its place, then answer the caller."""
        self._release(reg)
        if isinstance(end, BaseException):
            fail(result, end)
        else:
            _resolve(result, end)

    def _exchanged(
        self, reg: Registration, process: Exchanger, result: asyncio.Future[Outcome], outcome: Outcome
    ) -> None:
        try:
            if outcome.status is Status.SUCCEEDED:
                reg.adapter.read_outputs(outcome)
            if not process.alive:
                if self._died(reg, process):  # the last one: replaced before answering
                    self._background(self._after_death(reg, outcome, result))
                    return
            else:
                reg.deaths = 0
                if reg.pool is not None:
                    reg.pool.give_back(process)
        except BaseException as exc:
            self._settle(reg, result, exc)
            return
        self._settle(reg, result, outcome)

    def _died(self, reg: Registration, process: Exchanger) -> bool:
        """`process` died during an invocation: whether the registration has none left to serve,
        and is to be warmed again before that invocation is answered (so that the next finds
        one warm). A process's death counts once, however many invocations it ended."""
        pool = reg.pool
        if pool is None or not pool.forget(process):
            return False
        reg.deaths += 1
        if reg.deaths >= MAX_CONSECUTIVE_DEATHS:
            self._mark_fatal(reg, f"the function process exited {reg.deaths} times in a row")
            return False
        return reg.state == State.READY and pool.count() == 0

    async def _after_death(
        self, reg: Registration, outcome: Outcome, result: asyncio.Future[Outcome]
    ) -> None:
        try:
            await self._rewarm(reg)
        finally:
            self._release(reg)
            _resolve(result, outcome)

    async def _rewarm(self, reg: Registration) -> None:
        """Warm a fresh process now, not in the next invocation."""
        if reg.pool is None or reg.state != State.READY:  # being unregistered: nothing to warm
            return
        with contextlib.suppress(FunctionNotReady):
            process = await self._acquire(reg)
            reg.pool.give_back(process)

    async def _acquire(self, reg: Registration) -> Exchanger:
        """A warm process for an admitted invocation; FunctionNotReady (the registration marked
        so) when none can be started."""
        assert reg.pool is not None
        try:
            return await reg.pool.acquire()
        except (LoadFailed, SpawnError) as exc:
            self._mark_fatal(reg, f"the function process cannot be restarted: {exc}")
            raise FunctionNotReady(reg.fatal_error) from exc

    async def _invoke_slowly(
        self,
        reg: Registration,
        invocation_id: str,
        payload: bytes,
        timeout_s: float,
        result: asyncio.Future[Outcome],
    ) -> None:
        """An invocation that must start or run a process first (blocking work in a worker thread)."""
        loop = asyncio.get_running_loop()
        try:
            if reg.pool is not None:
                process = await self._acquire(reg)
                answered: asyncio.Future[Outcome] = loop.create_future()
                process.exchange(invocation_id, payload, timeout_s, functools.partial(_resolve, answered))
                outcome = await answered
                if outcome.status is Status.SUCCEEDED:
                    reg.adapter.read_outputs(outcome)
                if process.alive:
                    reg.deaths = 0
                    reg.pool.give_back(process)
                elif self._died(reg, process):
                    await self._rewarm(reg)
            else:
                since = time.monotonic()
                outcome = await loop.run_in_executor(None, self._invoke_exec, reg, payload, timeout_s, since)
        except BaseException as exc:
            self._settle(reg, result, exc)
            return
        self._settle(reg, result, outcome)

    def _check_fence(self, reg: Registration, fence: FenceLike) -> None:
        if fence.run_uid and fence.run_uid != reg.run.run_uid:
            raise FenceMismatch("registration belongs to another run")
        if fence.attempt and fence.attempt != reg.run.attempt:
            raise FenceMismatch(f"registration is attempt {reg.run.attempt}, not {fence.attempt}")
        if fence.host_uid and fence.host_uid != self.host_uid:
            raise FenceMismatch("this host is not the expected host incarnation")

    def _mark_fatal(self, reg: Registration, message: str) -> None:
        reg.fatal_error = message
        reg.state = State.NOT_READY
        log.error("registration not ready", extra={"run_uid": reg.run.run_uid, "error": message})
        self.on_change()

    def _invoke_exec(self, reg: Registration, payload: bytes, timeout_s: float, since: float) -> Outcome:
        """A per-call invocation, in a worker thread; its timeout counts from `since`, when it
        was handed to the threads (with many at once, some wait for one)."""
        timeout_s -= time.monotonic() - since
        if timeout_s <= 0:  # it waited its whole timeout for a thread: nothing of it started
            outcome = Outcome(Status.TIMED_OUT, exit_code=-9)
            set_error(outcome, Status.TIMED_OUT, "Timeout", "did not start within its timeout")
            return outcome
        lanes = reg.lanes
        run: RunOnce = (
            functools.partial(lanes.run, stop_past_limit=reg.adapter.stop_past_limit)
            if lanes is not None
            else functools.partial(run_once, self.spawner, self._spec(reg, once=True))
        )
        mine: list[int] = []

        def started(pid: int) -> None:
            mine.append(pid)
            reg.once_pids.add(pid)  # an unregistration past its grace kills it

        try:
            return reg.adapter.call(run, payload, timeout_s, on_start=started)
        except SpawnError as exc:
            raise HostUnavailable(str(exc)) from exc
        finally:
            reg.once_pids.difference_update(mine)

    async def drain(self) -> None:
        """Wait for invocations that left the hot path (restarts, bash runs) to finish."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            regs = list(self._by_id.values())
        self._sweeping.set()
        for reg in regs:
            self._teardown(reg, grace_s=0.0)
