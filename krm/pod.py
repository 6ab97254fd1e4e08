"""The pod evaluator: a function image served by function-mode Runs of a `krm` runtime.

Each image (FunctionConfig, image name, tag) has a pool of Runs whose handler is the function's
entrypoint; the Runtime Server's krm adapter runs it once per invocation with the ResourceList on
stdin (`kruntimes.wire.krm`). The platform is reached only through the SDK: create a Run, wait
until it is Ready, invoke it through the gateway, delete it. The Run lifecycle gives the cache:

- **Cache**: an image's Ready Runs. The TTL, extended by every use, is the Run's idle timeout
  (`podExecutor.ttl` as `idleTimeoutSeconds`); the platform's idle timer is the garbage collector.
  A Run idle for its TTL is forgotten here before it would be invoked, and one the platform no
  longer has (expired, Failed, cancelled: 404 or 503 from the gateway) is evicted and the
  evaluation goes to another Run, once: it never ran.
- **Up to `maxConcurrentEvaluations` evaluations in flight per Run** (the host runs each as a
  process of its own, up to its `--krm-concurrency`; a Run that answers Busy is taken to hold
  fewer and the evaluation, which never ran, is tried again). A request goes to the Ready Run with
  room that has the fewest in flight, least recently used among equals (round-robin).
- **Waitlist**: with no Run with room, a request waits on the Run (Ready and full, or being
  created) with the fewest waiters, so concurrent requests for a cold image share one creation;
  a Run that becomes Ready takes as many of its waiters at once as it has room for. When every
  Run has `maxWaitlist` waiters a new Run is created for the request (up to `maxParallel` Runs);
  beyond that the request is ResourceExhausted. A creation error goes to every waiter of that
  Run and the Run is forgotten, so the next request creates again.
- **Warming**: `warm()` creates, concurrently, one Run per FunctionConfig with a podExecutor
  (its first prefix at its first tag).
- A changed podExecutor (the FunctionConfig edited) retires the image's Runs: idle ones are
  deleted at once, busy ones when their evaluation ends.

In embedded mode an image's program is the FunctionConfig's `podExecutor.source` (a directory or
inline files, and the entrypoint). In a cluster it is `podExecutor.entrypoint`, a program of the
function's own image, on Runs of `podExecutor.runtime`: a krm runtime whose host pods are of that
image with the host injected by an init container (`kubernetes.hostInjection`). With neither the
image is NotFound here. A deadline is the
invocation's timeout (the host kills the function at it); a caller's cancellation while the
function runs deletes that Run, which kills the function's processes: at once when it was the
Run's only evaluation in flight, else the Run takes no more and is deleted when the others end
(they answer, the cancelled one is killed with the Run, or at its deadline if that comes first).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import secrets
import shlex
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kruntimes.api.run import Run
from kruntimes.krm import errors, process
from kruntimes.krm.config import PodExecutor
from kruntimes.krm.evaluation import Evaluation, Request
from kruntimes.krm.executable import interpret
from kruntimes.krm.limits import MAX_TIMEOUT_SECONDS
from kruntimes.krm.store import PodTarget, Store
from kruntimes.sdk.client import (
    Busy,
    Client,
    FunctionNotFound,
    InvocationFailed,
    KruntimesError,
    NotReady,
    OutcomeUnknown,
    PayloadRejected,
    RunObject,
)
from kruntimes.wire import krm as contract

log = logging.getLogger(__name__)

DEFAULT_RUNTIME = "krm"
START_TIMEOUT_SECONDS = 60.0
DELETE_TIMEOUT_SECONDS = 60.0
FINISHED_TTL_SECONDS = 600  # how long an ended Run stays queryable
GATEWAY_CATCH_UP_S = 5.0  # how long a new Run may be unknown to the gateway after Ready
CATCH_UP_PAUSE_S = 0.05
EVALUATOR_LABEL = "kruntimes.io/krm-evaluator"
IMAGE_FILE = "IMAGE"  # a cluster-mode Run's one source file: the image it serves
_SLUG = re.compile(r"[^a-z0-9]+")

State = Literal["creating", "ready", "gone"]


@dataclass(eq=False)
class PodRun:
    """One Run of an image's pool, as the evaluator sees it."""

    name: str
    pool: Pool
    state: State = "creating"
    run: RunObject | None = None
    in_flight: int = 0
    capacity: int = 1  # evaluations at once
    retire: bool = False
    waiters: deque[asyncio.Future[PodRun]] = field(default_factory=deque)
    last_used: float = field(default_factory=time.monotonic)
    served: int = 0
    routed: bool = False  # an invocation reached it through the gateway


@dataclass(eq=False)
class Pool:
    key: tuple[str, str, str]  # FunctionConfig, image name, tag
    target: PodTarget
    runs: list[PodRun] = field(default_factory=list)

    @property
    def executor(self) -> PodExecutor:
        return self.target.executor

    @property
    def ttl(self) -> float:
        return float(math.ceil(self.executor.ttl))


@dataclass
class Stats:
    created: int = 0  # creations started
    creation_failures: int = 0
    evicted: int = 0  # Runs found gone or failed, and forgotten
    expired: int = 0  # Runs idle for their TTL, forgotten
    exhausted: int = 0  # requests refused ResourceExhausted
    busy: int = 0  # evaluations a Run refused as Busy (and were tried again)


class PodEvaluator:
    name = "pod"

    def __init__(
        self,
        store: Store,
        *,
        client: Client | None,
        runtime: str = DEFAULT_RUNTIME,
        namespace: str = "default",
        start_timeout: float = START_TIMEOUT_SECONDS,
    ) -> None:
        self.store = store
        self.client = client
        self.runtime = runtime
        self.namespace = namespace
        self.start_timeout = start_timeout
        self.instance = secrets.token_hex(3)
        self.stats = Stats()
        self._pools: dict[tuple[str, str, str], Pool] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._names: set[str] = set()  # every Run this evaluator created and has not deleted

    # --- the Evaluator interface -----------------------------------------------------------------

    async def evaluate(self, request: Request) -> Evaluation:
        if self.client is None:
            raise errors.NotFound(f"{request.image}: the pod evaluator has no platform to run it on")
        target = self.store.pod(request.image, request.tag)
        try:
            payload = contract.encode_request(request.resource_list)
        except contract.ContractError as e:
            raise errors.InputTooLarge(str(e)) from e
        pool = self._pool(target)
        for attempt in (1, 2):
            run = await self._acquire(pool, request)
            try:
                return await self._invoke(run, payload, request)
            except _Full as e:
                # The host takes fewer at once than configured: the Run counts as holding what
                # it holds without this one.
                self.stats.busy += 1
                run.capacity = max(1, run.in_flight - 1)
                if attempt == 2 or request.remaining() <= 0:
                    raise errors.ResourceExhausted(f"{request.image}: Run {run.name} is busy: {e}") from e
            except _Gone as e:
                self._evict(run, str(e))
                if attempt == 2 or request.remaining() <= 0:
                    raise errors.SystemError_(f"{request.image}: Run {run.name} is gone: {e}") from e
            finally:
                self._release(run)
        raise AssertionError("unreachable")

    # --- warming and closing ---------------------------------------------------------------------

    async def warm(self) -> dict[str, str]:
        """One Run per FunctionConfig with a podExecutor source, created concurrently and waited
        for; what failed, by image (an empty dict: all Ready)."""
        if self.client is None:
            return {}
        creations: dict[str, PodRun] = {}
        for config in self.store.configs():
            executor = config.spec.podExecutor
            if executor is None or not executor.runnable:
                continue
            tag = executor.tags[0].strip() if executor.tags else ""
            target = PodTarget(config.key, config.spec.prefixes[0], tag, executor)
            pool = self._pool(target)
            if not pool.runs:
                creations[target.image] = self._create(pool)
        # Wait as one more waiter would on each, and give the Run back. Every waiter is in place
        # before the first await: a creation that ends while another is awaited hands its Run to
        # the waiters it has then, so a waiter added later would wait forever.
        loop = asyncio.get_running_loop()
        waiting: dict[str, asyncio.Future[PodRun]] = {}
        for image, run in creations.items():
            waiting[image] = loop.create_future()
            run.waiters.append(waiting[image])
        failures: dict[str, str] = {}
        for image, future in waiting.items():
            try:
                self._release(await future)
            except errors.KrmError as e:
                failures[image] = str(e)
        return failures

    async def close(self) -> None:
        """Delete every Run this evaluator created (and wait for the deletions)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.client is not None:
            await asyncio.gather(*(self._delete(name) for name in sorted(self._names)))
        self._pools.clear()

    def snapshot(self) -> dict[str, list[tuple[str, str, int]]]:
        """Each image's Runs as (name, state, evaluations in flight)."""
        return {
            pool.target.image: [(r.name, r.state, r.in_flight) for r in pool.runs]
            for pool in self._pools.values()
        }

    def waiters(self) -> dict[str, list[int]]:
        """Each image's Runs' waitlist lengths."""
        return {pool.target.image: [len(r.waiters) for r in pool.runs] for pool in self._pools.values()}

    # --- the pool --------------------------------------------------------------------------------

    def _pool(self, target: PodTarget) -> Pool:
        key = (target.config, target.name, target.tag)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = Pool(key, target)
        elif pool.target.executor != target.executor:
            pool.target = target
            for run in list(pool.runs):
                run.retire = True
                if run.state == "ready" and run.in_flight == 0:
                    self._forget(run, delete=True)
        return pool

    async def _acquire(self, pool: Pool, request: Request) -> PodRun:
        now = time.monotonic()
        for run in list(pool.runs):
            if run.state == "ready" and run.in_flight == 0 and now - run.last_used >= _expiry(pool.ttl):
                self.stats.expired += 1
                self._forget(run, delete=True)  # its idle timer ends it now, if it has not already
        live = [r for r in pool.runs if r.state != "gone" and not r.retire]
        room = [r for r in live if r.state == "ready" and r.in_flight < r.capacity]
        if room:
            run = min(room, key=lambda r: (r.in_flight, r.last_used))
            run.in_flight += 1
            run.last_used = now
            return run
        waiting = min(live, key=lambda r: len(r.waiters), default=None)
        if waiting is not None and len(waiting.waiters) < pool.executor.maxWaitlist:
            run = waiting
        elif len(live) < pool.executor.maxParallel:
            run = self._create(pool)
        else:
            self.stats.exhausted += 1
            raise errors.ResourceExhausted(
                f"{pool.target.image}: {len(live)} Runs (maxParallel) each have "
                f"{pool.executor.maxWaitlist} evaluations waiting (maxWaitlist); retry later"
            )
        future: asyncio.Future[PodRun] = asyncio.get_running_loop().create_future()
        run.waiters.append(future)
        try:
            async with asyncio.timeout(request.remaining()) as timer:
                return await future
        except BaseException as e:
            if future.done() and not future.cancelled() and future.exception() is None:
                self._release(future.result())  # handed over just as its waiter went away
            else:
                future.cancel()
                with contextlib.suppress(ValueError):
                    run.waiters.remove(future)
            if isinstance(e, TimeoutError) and timer.expired():
                raise errors.DeadlineExceeded(
                    f"{pool.target.image}: the deadline passed while waiting for Run {run.name}"
                ) from e
            raise

    def _release(self, run: PodRun) -> None:
        """An evaluation on `run` is over: hand its place to the next waiter, or leave it free."""
        if run.in_flight == 0:
            return
        run.in_flight -= 1
        run.last_used = time.monotonic()
        if run.state != "ready":
            return
        if run.retire:
            if run.in_flight == 0:
                self._forget(run, delete=True)
            return
        self._hand_over(run)

    def _hand_over(self, run: PodRun) -> None:
        """Give `run`'s free places to waiters: its own first, then the longest other waitlist."""
        while run.in_flight < run.capacity:
            queues = [run.waiters] + sorted(
                (r.waiters for r in run.pool.runs if r is not run and r.waiters),
                key=len,
                reverse=True,
            )
            future = next((q.popleft() for q in queues if q), None)
            if future is None:
                return
            if not future.done():
                run.in_flight += 1
                future.set_result(run)

    # --- creating and deleting Runs --------------------------------------------------------------

    def _run_name(self, target: PodTarget) -> str:
        slug = _SLUG.sub("-", target.name.rsplit("/", 1)[-1].lower()).strip("-")[:28] or "fn"
        return f"krm-{slug}-{self.instance}-{secrets.token_hex(3)}"

    def _create(self, pool: Pool) -> PodRun:
        run = PodRun(
            name=self._run_name(pool.target), pool=pool, capacity=pool.executor.maxConcurrentEvaluations
        )
        pool.runs.append(run)
        self.stats.created += 1
        self._background(self._start(run))
        return run

    async def _start(self, run: PodRun) -> None:
        assert self.client is not None
        try:
            manifest = self._manifest(run)
            self._names.add(run.name)
            async with asyncio.timeout(self.start_timeout):  # create → Ready, bounded as a whole
                await self.client.create(manifest)
                ready = await self.client.wait(run.name, self.namespace, timeout=None)
        except Exception as e:  # every waiter hears of it, whatever it was
            self.stats.creation_failures += 1
            why = f"not Ready within {self.start_timeout:g} s" if isinstance(e, TimeoutError) else str(e)
            failure = errors.SystemError_(f"{run.pool.target.image}: creating Run {run.name} failed: {why}")
            log.warning("%s", failure)
            waiters = list(run.waiters)
            run.waiters.clear()
            self._forget(run, delete=True)
            for future in waiters:
                if not future.done():
                    future.set_exception(failure)
            return
        if run.state == "gone":  # forgotten meanwhile
            return
        run.run, run.state, run.last_used = ready, "ready", time.monotonic()
        self._hand_over(run)  # a retired Run still serves those who waited for it, then goes
        if run.retire and run.in_flight == 0:
            self._forget(run, delete=True)

    def _manifest(self, run: PodRun) -> Run:
        target = run.pool.target
        executor = target.executor
        source = executor.source
        spec_source: dict[str, Any]
        if source is not None:
            entrypoint = source.entrypoint
            if source.inline is not None:
                spec_source = {"inline": [f.model_dump() for f in source.inline]}
            else:
                assert source.path is not None
                spec_source = {"path": str(self._source_path(target, source.path))}
        elif executor.entrypoint is not None:
            # Cluster mode: the program is in the image of the runtime's pods; the Run's source
            # only records which image it serves.
            entrypoint = executor.entrypoint
            spec_source = {"inline": [{"name": IMAGE_FILE, "content": f"{target.name}:{target.tag}\n"}]}
        else:
            raise errors.NotFound(f"{target.image}: no podExecutor source or entrypoint")
        return Run.from_dict(
            {
                "apiVersion": "kruntimes.io/v1alpha1",
                "kind": "Run",
                "metadata": {
                    "name": run.name,
                    "namespace": self.namespace,
                    "labels": {EVALUATOR_LABEL: self.instance},
                },
                "spec": {
                    "runtime": executor.runtime or self.runtime,
                    "mode": {"function": {"idleTimeoutSeconds": int(run.pool.ttl)}},
                    "source": spec_source,
                    "handler": shlex.join(entrypoint),
                    "retryPolicy": {"limit": 1},
                    "ttlSecondsAfterFinished": FINISHED_TTL_SECONDS,
                },
            }
        )

    def _source_path(self, target: PodTarget, raw: str) -> Path:
        path = Path(raw)
        if path.is_absolute():
            return path
        base = self.store.functions_dir
        if base is None:
            raise errors.NotFound(
                f"{target.image}: relative podExecutor.source.path but no functions directory"
            )
        resolved = (base / path).resolve()
        if not resolved.is_relative_to(base):
            raise errors.NotFound(f"{target.image}: podExecutor.source.path leaves the functions directory")
        return resolved

    def _evict(self, run: PodRun, why: str) -> None:
        self.stats.evicted += 1
        log.info("Run %s of %s evicted: %s", run.name, run.pool.target.image, why)
        self._forget(run, delete=True)

    def _forget(self, run: PodRun, *, delete: bool) -> None:
        run.state = "gone"
        with contextlib.suppress(ValueError):
            run.pool.runs.remove(run)
        if delete and self.client is not None:
            self._background(self._delete(run.name))

    async def _delete(self, name: str) -> None:
        assert self.client is not None
        try:
            await self.client.delete(name, self.namespace, timeout=DELETE_TIMEOUT_SECONDS)
        except KruntimesError as e:
            log.warning("cannot delete Run %s: %s", name, e)
            return
        self._names.discard(name)

    def _background(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- one evaluation ------------------------------------------------------------------------

    async def _invoke(self, run: PodRun, payload: bytes, request: Request) -> Evaluation:
        assert self.client is not None and run.run is not None
        remaining = min(request.remaining(), MAX_TIMEOUT_SECONDS)
        if remaining <= 0:
            raise errors.DeadlineExceeded(f"the deadline passed before Run {run.name} was invoked")
        run.served += 1
        # A Run just Ready may not be routed by the gateway yet (its host's next heartbeat, the
        # gateway's next look at the Runs): until one invocation has reached it, each asks again
        # for a moment before the Run counts as gone. Neither answer ran the function.
        catch_up = 0.0 if run.routed else time.monotonic() + min(GATEWAY_CATCH_UP_S, remaining)
        try:
            while True:
                try:
                    answer = await self.client.invoke(run.run, payload, timeout=max(remaining, 0.001))
                    run.routed = True
                    break
                except (FunctionNotFound, NotReady) as e:
                    if time.monotonic() >= catch_up:
                        raise _Gone(f"{e.status} {e.reason}") from e
                    await asyncio.sleep(CATCH_UP_PAUSE_S)
                    remaining = min(request.remaining(), MAX_TIMEOUT_SECONDS)
        except Busy as e:
            raise _Full(f"{e.status} {e.reason}") from e
        except OutcomeUnknown as e:
            if e.reason == "InvocationTimeout" or request.remaining() <= 0:
                raise errors.DeadlineExceeded("the function ran past its deadline and was killed") from e
            self._evict(run, f"{e.status} {e.reason}")
            raise errors.SystemError_(f"Run {run.name}: the invocation's outcome is unknown: {e}") from e
        except InvocationFailed as e:
            kind = (e.result.error or {}).get("type", e.reason)
            if kind == "InvalidOutput" or e.result.status == "InvalidOutput":
                raise errors.InvalidOutput(f"the function's answer was refused: {e}") from e
            raise errors.SystemError_(f"Run {run.name} refused the evaluation: {e}") from e
        except PayloadRejected as e:
            raise errors.InvalidRequest(f"the gateway refused the ResourceList: {e}") from e
        except KruntimesError as e:
            raise errors.SystemError_(f"Run {run.name} cannot be invoked: {e}") from e
        except asyncio.CancelledError:
            # The function may still run on the host: deleting its Run kills its processes. The
            # Run's other evaluations (this one still counts in `in_flight`) answer first.
            if run.in_flight <= 1:
                self._evict(run, "the caller went away during the evaluation")
            else:
                log.info("Run %s of %s retired: a caller went away", run.name, run.pool.target.image)
                run.retire = True
            raise
        try:
            exit_code, stdout, written = contract.decode_outputs(answer.outputs)
        except contract.ContractError as e:
            raise errors.SystemError_(f"Run {run.name} answered outside the krm contract: {e}") from e
        stderr = answer.stderr.data.encode()
        if stdout is None:
            raise errors.OutputTooLarge(
                f"the function wrote {written} bytes to stdout, over the pod evaluator's bound of "
                f"{contract.MAX_STDOUT_BYTES}",
                evaluation=Evaluation(b"", stderr, answer.stderr.truncated, (), exit_code),
            )
        return interpret(process.Outcome(stdout, stderr, answer.stderr.truncated, exit_code))


class _Gone(Exception):
    """The Run did not take the evaluation (the platform no longer has it Ready): it never ran."""


class _Full(Exception):
    """The Run's host refused the evaluation as Busy (it takes fewer at once): it never ran."""


def _expiry(ttl: float) -> float:
    """How long an idle Run is used: its TTL less a margin, so it is not invoked as it expires."""
    return max(ttl - min(2.0, ttl / 4), 0.0)
