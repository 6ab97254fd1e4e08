"""POST /v1/namespaces/{namespace}/functions/{uid}:invoke — a Function's URL (issue #43).

The same hot path as a Run's (gateway/invoke.py, whose dispatch and answers this reuses): route
cache → cached authorization (the Function in its namespace: a binding for the namespace covers
it) → the body (bounded in size and rate) → one InvokeFunction on one replica's host → the
gateway's own answer. What differs is which route: a Function has many replicas (Runs whose signed
assignment names the Function's uid), and the `Balancer` picks one.

Balancing, as this gateway counts (each gateway counts its own invocations; a host still refuses
past its own concurrency and queue, 429 as for a Run):
- a Function with a traffic split (two revisions, as the known-Functions view read it from its
  workflow's KrtTraffic): first a revision, at random by its percent, among the revisions with a
  Ready replica with room; one without any takes nothing and the other takes it (a split never
  refuses an invocation); then, within that revision, as below;
- the Ready replica of the Function in the request's namespace with the fewest invocations in
  flight from this gateway, ties in turn; never one already at its concurrency while another has
  room;
- when every Ready replica is at its concurrency, the invocation waits at the gateway in a FIFO
  per Function (at most MAX_WAITING_PER_FUNCTION, and MAX_WAITING over all Functions; beyond: 429
  ReplicasFull), at most its own timeout (then 429 QueueTimeout: it never ran); a slot freed by
  one of the Function's invocations, or a replica that appears or becomes Ready, goes to the
  first waiter. A caller that hangs up while waiting is withdrawn;
- no Ready replica (scale from zero: min 0, idled away, just created, its replicas replaced): with
  Temporal configured, the invocation is held in the same wait (the same bounds: beyond them 503
  NoReadyReplica) and the Function's workflow is asked for a replica (gateway/wake.py: its `wake`
  signal, at most once a second per Function, in the background); the first replica to become
  Ready takes the held invocations in order. Still none Ready at the invocation's timeout, or the
  signal not sent: 503 NoReadyReplica with Retry-After (it never ran). Without Temporal, or for a
  Function the gateway cannot name (neither the known-Functions view nor a route of it says its
  name): 503 NoReadyReplica at once;
- a uid that is neither seen in this namespace's routes nor a Function of it in the known-Functions
  view (or nowhere at all): 404 FunctionNotFound, the same answer either way, so a uid's
  existence in another namespace is not told.

Nothing is retried after dispatch. An invocation that was not delivered (503: the connection was
refused, the route went away, the host refused the fence or cannot serve) goes to another
replica, waiting as a new one would, up to MAX_UNDELIVERED_TRIES replicas in all; a replica that
refused one takes nothing new for SUSPECT_S. The time it waited counts against its timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from kruntimes.api.names import is_run_uid
from kruntimes.gateway.answers import answer_body
from kruntimes.gateway.auth import FUNCTIONS, Authorizer, Forbidden, Resource, bearer_token
from kruntimes.gateway.errors import (
    Busy,
    ClientAborted,
    GatewayError,
    NotFound,
    OwnerUnavailable,
    RunNotReady,
)
from kruntimes.gateway.invoke import (
    INVOCATION_ID,
    InvokeHandler,
    Upstreams,
    invocation_id,
    read_body,
    requested_timeout_s,
)
from kruntimes.gateway.listener import GatewayProtocol, HttpLimits
from kruntimes.gateway.metrics import GatewayMetrics
from kruntimes.gateway.routes import Route, RouteCache, SeenFunction
from kruntimes.gateway.wake import Waker
from kruntimes.temporal.known_functions import KnownFunction, KnownFunctions
from kruntimes.temporal.known_runs import KnownRuns
from kruntimes.wire import headers
from kruntimes.wire.reasons import GatewayReason as R

log = logging.getLogger("kruntimes.gateway.invoke")

MAX_WAITING_PER_FUNCTION = 1_000
MAX_WAITING = 10_000
# A replica an invocation could not be delivered to (its host refused the connection, is gone or
# not the one routed) takes no new invocation for this long: with fewest-in-flight picking, a dead
# replica answering at once would otherwise draw every invocation until its route expires.
SUSPECT_S = 2.0
# Replicas an invocation that was not delivered tries in all (a rollout may retire several at
# once, each still routed until its host's next beat): each refusal is before dispatch, so safe.
MAX_UNDELIVERED_TRIES = 3
MAX_SUSPECTS = 10_000
# A fresh gateway has not heard every host yet: a Function it has not seen is not yet "not found".
DEFAULT_WARMUP_S = 10.0
# where the access log finds the replica an invocation went to
REPLICA = web.RequestKey("replica_run_uid", str)


def _full() -> Busy:
    return Busy(
        "every replica of the Function runs as many invocations as it takes and the gateway's wait "
        "for it is full; it did not run, retry later",
        reason=R.REPLICAS_FULL,
    )


def _no_replica(message: str = "the Function has no Ready replica now; it did not run") -> RunNotReady:
    return RunNotReady(message, reason=R.NO_READY_REPLICA)


def _held_full() -> RunNotReady:
    return _no_replica(
        "the Function has no Ready replica yet and the gateway holds as many invocations as it may "
        "while one starts; it did not run, retry later"
    )


def _not_woken() -> RunNotReady:
    return _no_replica(
        "the Function has no Ready replica and the gateway could not ask for one; it did not run"
    )


@dataclass(slots=True)
class _Waiter:
    future: asyncio.Future[Route]
    namespace: str


class Balancer:
    """Which replica of a Function takes an invocation, and the waits at the gateway when none
    has room. Runs on the gateway's event loop: no locks."""

    def __init__(
        self,
        routes: RouteCache,
        metrics: GatewayMetrics | None = None,
        *,
        max_waiting_per_function: int = MAX_WAITING_PER_FUNCTION,
        max_waiting: int = MAX_WAITING,
        warmup_s: float = DEFAULT_WARMUP_S,
        rng: random.Random | None = None,
    ) -> None:
        self.routes = routes
        # the traffic split's draw: not a secret, only a share (seeded in tests)
        self.rng = rng or random.Random()
        # until then a Function never seen may live on a host not heard yet: 503, not 404
        self.warm_until = time.monotonic() + warmup_s
        self.metrics = metrics
        self.max_waiting_per_function = max_waiting_per_function
        self.max_waiting = max_waiting
        self._in_flight: dict[str, int] = {}  # replica run uid → its invocations from this gateway
        self._function_in_flight: dict[str, int] = {}  # function uid → the same, over its replicas
        self._waiters: dict[str, deque[_Waiter]] = {}  # function uid → its waits, first first
        self._waiting = 0
        self._turns = itertools.count()  # ties go in turn
        self._appeared: set[str] = set()  # functions with a new ready route, served soon
        # (replica run uid, host uid) → until when it takes nothing new (SUSPECT_S)
        self._suspects: dict[tuple[str, str], float] = {}
        routes.on_function_route = self._route_appeared
        # scale from zero: which Functions exist (Temporal visibility) and who asks their workflow
        # for a replica; None: no Temporal, a Function without a Ready replica is 503 at once
        self.functions: KnownFunctions | None = None
        self.waker: Waker | None = None

    def use_temporal(self, functions: KnownFunctions, waker: Waker) -> None:
        """Hold invocations of Functions without a Ready replica, and wake their workflows."""
        self.functions, self.waker = functions, waker
        waker.on_failed = self._not_woken

    def known(self, function_uid: str, namespace: str) -> KnownFunction | None:
        """The Function in `namespace` as the known-Functions view lists it (not being deleted)."""
        found = self.functions.get(function_uid) if self.functions is not None else None
        if found is None or found.namespace != namespace or found.deleted:
            return None
        return found

    def wake_target(self, function_uid: str, namespace: str, seen: SeenFunction | None) -> str:
        """The workflow id to wake when the Function has no Ready replica ("" if none may be)."""
        if self.waker is None:
            return ""
        known = self.known(function_uid, namespace)
        if known is not None:
            return known.workflow_id
        if seen is not None and seen.namespace == namespace and seen.name:
            return f"function/{namespace}/{seen.name}"  # names.function_workflow_id
        return ""

    def in_flight(self, run_uid: str) -> int:
        """This gateway's invocations on a replica now."""
        return self._in_flight.get(run_uid, 0)

    def function_in_flight(self, function_uid: str) -> int:
        """This gateway's invocations on the Function's replicas now (the autoscaler's load)."""
        return self._function_in_flight.get(function_uid, 0)

    def waiting(self, function_uid: str | None = None) -> int:
        """Invocations waiting at this gateway (for one Function, or all)."""
        if function_uid is None:
            return self._waiting
        return len(self._waiters.get(function_uid, ()))

    def ready(self, function_uid: str, namespace: str) -> bool:
        """Whether the Function has a Ready replica in `namespace`."""
        return any(r.ready and r.namespace == namespace for r in self.routes.function_routes(function_uid))

    def capacity(self, function_uid: str, namespace: str) -> int:
        """The concurrency of the Function's Ready replicas in `namespace` together (what an async
        attempt's share is of: gateway/dispatch.py)."""
        return sum(
            r.concurrency
            for r in self.routes.function_routes(function_uid)
            if r.ready and r.namespace == namespace
        )

    def split(self, function_uid: str, namespace: str) -> tuple[tuple[int, int], ...]:
        """The Function's traffic split as the known-Functions view read it: (revision, percent)."""
        known = self.known(function_uid, namespace)
        return known.traffic if known is not None else ()

    def _pick_revision(self, split: tuple[tuple[int, int], ...], candidates: list[Route]) -> int | None:
        """A revision of the split, at random by its percent, among those `candidates` serve
        (None: neither does, any candidate goes)."""
        served = {r.revision for r in candidates}
        shares = [(revision, percent) for revision, percent in split if revision in served and percent > 0]
        total = sum(percent for _, percent in shares)
        if not total:
            return None
        draw = self.rng.random() * total
        for revision, percent in shares:
            draw -= percent
            if draw < 0:
                return revision
        return shares[-1][0]

    def choose(self, function_uid: str, namespace: str, *, avoid: str = "") -> Route | None:
        """The Ready replica with room and the fewest in flight (ties in turn), its slot taken;
        None if no Ready replica has room. With a traffic split, a revision is drawn first (among
        those with such a replica) and the replica is of it. `avoid`: a replica run uid not to
        choose."""
        candidates: list[Route] = []
        now = time.monotonic() if self._suspects else 0.0
        for route in self.routes.function_routes(function_uid):
            if not route.ready or route.namespace != namespace or route.run_uid == avoid:
                continue
            if self._suspects and self._suspects.get((route.run_uid, route.host_uid), 0.0) > now:
                continue
            if self._in_flight.get(route.run_uid, 0) >= route.concurrency:
                continue
            candidates.append(route)
        if not candidates:
            return None
        split = self.split(function_uid, namespace) if self.functions is not None else ()
        if split:
            revision = self._pick_revision(split, candidates)
            if revision is not None:
                candidates = [r for r in candidates if r.revision == revision]
        fewest = min(self._in_flight.get(r.run_uid, 0) for r in candidates)
        least = [r for r in candidates if self._in_flight.get(r.run_uid, 0) == fewest]
        if len(least) > 1:
            least.sort(key=lambda r: r.run_uid)  # a stable order for the turns
            route = least[next(self._turns) % len(least)]
        else:
            route = least[0]
        self._in_flight[route.run_uid] = fewest + 1
        self._function_in_flight[function_uid] = self._function_in_flight.get(function_uid, 0) + 1
        if self.metrics is not None:
            self.metrics.function_in_flight.inc()
        return route

    def release(self, route: Route) -> None:
        """The invocation on `route` ended (or was never sent): its slot goes to the Function's
        first waiter, if any."""
        n = self._in_flight.get(route.run_uid, 0) - 1
        if n > 0:
            self._in_flight[route.run_uid] = n
        else:
            self._in_flight.pop(route.run_uid, None)
        n = self._function_in_flight.get(route.function_uid, 0) - 1
        if n > 0:
            self._function_in_flight[route.function_uid] = n
        else:
            self._function_in_flight.pop(route.function_uid, None)
        if self.metrics is not None:
            self.metrics.function_in_flight.dec()
        if route.function_uid in self._waiters:
            self._serve(route.function_uid)

    def suspect(self, route: Route) -> None:
        """An invocation could not be delivered to `route`: it takes nothing new for SUSPECT_S
        (a newer incarnation of its host, or the Run moved elsewhere, is another key), and the
        Function's waiters are served again once that has passed."""
        now = time.monotonic()
        if len(self._suspects) >= MAX_SUSPECTS:
            self._suspects = {k: t for k, t in self._suspects.items() if t > now}
            if len(self._suspects) >= MAX_SUSPECTS:
                return
        self._suspects[(route.run_uid, route.host_uid)] = now + SUSPECT_S
        asyncio.get_running_loop().call_later(SUSPECT_S, self._unsuspect, route, route.function_uid)

    def _unsuspect(self, route: Route, function_uid: str) -> None:
        key = (route.run_uid, route.host_uid)
        if self._suspects.get(key, 0.0) <= time.monotonic():
            self._suspects.pop(key, None)
        if function_uid in self._waiters:
            self._serve(function_uid)

    def _serve(self, function_uid: str) -> None:
        """Hand the slots free now to the Function's waiters, first first."""
        waiters = self._waiters.get(function_uid)
        while waiters:
            head = waiters[0]
            route = self.choose(function_uid, head.namespace)
            if route is None:
                break
            waiters.popleft()
            self._waiting -= 1
            if self.metrics is not None:
                self.metrics.function_waiting.dec()
            head.future.set_result(route)
        if not waiters:
            self._waiters.pop(function_uid, None)

    def _route_appeared(self, function_uid: str) -> None:
        # Called while the route cache applies a beat: served once that beat is applied.
        if function_uid in self._waiters and function_uid not in self._appeared:
            self._appeared.add(function_uid)
            asyncio.get_running_loop().call_soon(self._serve_appeared, function_uid)

    def _serve_appeared(self, function_uid: str) -> None:
        self._appeared.discard(function_uid)
        self._serve(function_uid)

    def _not_woken(self, function_uid: str) -> None:
        """The Function's workflow could not be asked: its waiters without a Ready replica in
        their namespace end now (503), never left to their timeout."""
        waiters = self._waiters.get(function_uid)
        if not waiters:
            return
        for waiter in [w for w in waiters if not self.ready(function_uid, w.namespace)]:
            waiters.remove(waiter)
            self._waiting -= 1
            if self.metrics is not None:
                self.metrics.function_waiting.dec()
            if not waiter.future.done():
                waiter.future.set_exception(_not_woken())
        if not waiters:
            self._waiters.pop(function_uid, None)

    def _outcome(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.function_waits.labels(outcome).inc()

    def _withdraw(self, function_uid: str, waiters: deque[_Waiter], waiter: _Waiter) -> Route | None:
        """The wait is over: the route it was handed, or None (and it leaves the queue); raises
        what ended it (the Function's workflow could not be asked)."""
        if waiter.future.done():
            return waiter.future.result()
        waiter.future.cancel()
        with contextlib.suppress(ValueError):
            waiters.remove(waiter)
            self._waiting -= 1
            if self.metrics is not None:
                self.metrics.function_waiting.dec()
        if not waiters and self._waiters.get(function_uid) is waiters:
            del self._waiters[function_uid]
        return None

    async def acquire(
        self,
        function_uid: str,
        namespace: str,
        *,
        timeout_s: float,
        lost: asyncio.Future[None],
        wake: str = "",
    ) -> Route:
        """A replica route with its slot taken (release it when the invocation ends): at once if
        one has room and nobody waits before, else after a wait of at most `timeout_s`. `wake`:
        the Function's workflow id, to hold the invocation and ask for a replica when none is
        Ready ("": 503 at once then). Raises RunNotReady (no Ready replica, none became Ready in
        time, or the workflow could not be asked), Busy (the wait is full, or timed out) or
        ClientAborted (`lost` happened while waiting)."""
        if function_uid in self._waiters:
            self._serve(function_uid)  # whoever waits goes first
        if function_uid not in self._waiters:
            route = self.choose(function_uid, namespace)
            if route is not None:
                return route
        cold = not self.ready(function_uid, namespace)
        if cold and (not wake or self.waker is None):
            raise _no_replica()
        waiters = self._waiters.get(function_uid)
        if self._waiting >= self.max_waiting or (
            waiters is not None and len(waiters) >= self.max_waiting_per_function
        ):
            self._outcome("full")
            raise _held_full() if cold else _full()
        if cold and self.waker is not None:
            self.waker.wake(function_uid, wake)
        if waiters is None:
            waiters = self._waiters[function_uid] = deque()
        waiter = _Waiter(asyncio.get_running_loop().create_future(), namespace)
        waiters.append(waiter)
        self._waiting += 1
        if self.metrics is not None:
            self.metrics.function_waiting.inc()
        try:
            await asyncio.wait((waiter.future, lost), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the gateway stops: a slot handed meanwhile goes on
            with contextlib.suppress(RunNotReady):
                handed = self._withdraw(function_uid, waiters, waiter)
                if handed is not None:
                    self.release(handed)
            raise
        try:
            route = self._withdraw(function_uid, waiters, waiter)
        except RunNotReady:
            self._outcome("not_woken")
            raise
        if route is not None and not lost.done():
            self._outcome("dispatched")
            return route
        if route is not None:  # handed a slot just as the caller hung up: the next waiter gets it
            self.release(route)
        if lost.done():
            self._outcome("withdrawn")
            raise ClientAborted()
        if not self.ready(function_uid, namespace):
            self._outcome("cold_timeout")
            raise _no_replica(
                "no replica of the Function became Ready within the invocation's timeout; it did not run"
            )
        self._outcome("timeout")
        raise Busy(
            "every replica of the Function stayed full for the invocation's timeout; it did not run, "
            "retry later",
            reason=R.QUEUE_TIMEOUT,
        )


def _lost(request: web.Request) -> asyncio.Future[None]:
    if isinstance(request.protocol, GatewayProtocol):
        return request.protocol.lost()
    return asyncio.get_running_loop().create_future()  # not the gateway's listener: never lost


class FunctionInvokeHandler(InvokeHandler):
    """A Function's URL: the Run path's dispatch and answers, to a replica the Balancer picks."""

    def __init__(
        self,
        *,
        routes: RouteCache,
        known: KnownRuns,
        authorizer: Authorizer,
        upstreams: Upstreams,
        balancer: Balancer,
        limits: HttpLimits | None = None,
    ) -> None:
        super().__init__(
            routes=routes, known=known, authorizer=authorizer, upstreams=upstreams, limits=limits
        )
        self.balancer = balancer

    async def __call__(self, request: web.Request) -> web.Response:
        inv = invocation_id(request)
        request[INVOCATION_ID] = inv
        namespace = request.match_info["namespace"]
        function_uid = request.match_info["uid"]
        token = bearer_token(request.headers.get(headers.AUTHORIZATION))
        seen, known = self.lookup(function_uid, namespace)
        if seen is None and known is None:
            unknown = Resource(namespace=namespace, name="", run_uid="", kind=FUNCTIONS)
            error = self.unknown(function_uid)
            if not isinstance(error, NotFound):
                await self.authorizer.authorize(token, unknown)
                raise error
            # Authenticate first: a caller without a valid token learns nothing (401 either way);
            # a valid one gets the same 404 whether or not the uid lives in another namespace.
            with contextlib.suppress(Forbidden):
                await self.authorizer.authorize(token, unknown)
            raise error
        name = known.name if known is not None else seen.name if seen is not None else ""
        await self.authorizer.authorize(
            token, Resource(namespace=namespace, name=name, run_uid=function_uid, kind=FUNCTIONS)
        )
        timeout_s = requested_timeout_s(request)
        wake = self.balancer.wake_target(function_uid, namespace, seen)
        if not wake and not self.balancer.ready(function_uid, namespace):  # refused before the body
            raise _no_replica()
        payload = await read_body(request, self.limits)

        def replica(run_uid: str) -> None:
            request[REPLICA] = run_uid

        body = await self.deliver_function(
            function_uid, namespace, inv, payload, timeout_s, lost=_lost(request), wake=wake, replica=replica
        )
        return self._answer(body, inv)

    def lookup(self, function_uid: str, namespace: str) -> tuple[SeenFunction | None, KnownFunction | None]:
        """The Function in `namespace` as its routes saw it and as the known-Functions view lists
        it (both None: `unknown` says what to answer)."""
        if not is_run_uid(function_uid):
            return None, None
        seen = self.routes.seen_function(function_uid)
        if seen is not None and seen.namespace != namespace:
            seen = None
        return seen, self.balancer.known(function_uid, namespace)

    def unknown(self, function_uid: str) -> GatewayError:
        """A Function neither seen nor known here: 503 while the gateway may not have heard every
        host yet, else 404."""
        if is_run_uid(function_uid) and time.monotonic() < self.balancer.warm_until:
            return RunNotReady("the gateway is starting", reason=R.NO_READY_REPLICA, retry_after=1)
        return NotFound("no such Function in this namespace", reason=R.FUNCTION_NOT_FOUND)

    async def deliver_function(
        self,
        function_uid: str,
        namespace: str,
        inv: str,
        payload: bytes,
        timeout_s: float,
        *,
        lost: asyncio.Future[None],
        wake: str,
        replica: Callable[[str], None] | None = None,
    ) -> bytes:
        """One invocation of the Function on the replica the balancer gives it (waiting, or
        waking the Function, as `acquire` says), as the sync invoke and an async attempt
        (gateway/dispatch.py) both run it: the 200 body, or the GatewayError it is answered
        with. `replica` is told each replica it is sent to."""
        started = time.monotonic()
        route = await self.balancer.acquire(
            function_uid, namespace, timeout_s=timeout_s, lost=lost, wake=wake
        )
        held: Route | None = route  # the slot this invocation holds, released once it ends
        try:
            for tries_left in range(MAX_UNDELIVERED_TRIES - 1, -1, -1):
                if replica is not None:
                    replica(route.run_uid)
                remaining = max(0.001, timeout_s - (time.monotonic() - started))
                try:
                    answer = await self._dispatch(route, inv, payload, remaining, lost=lost)
                    break
                except (OwnerUnavailable, RunNotReady) as undelivered:  # it did not run: another
                    if not tries_left:
                        raise
                    log.info(
                        "invoke not delivered; another replica tried",
                        extra={"run_uid": route.run_uid, "reason": str(undelivered.reason)},
                    )
                    self.balancer.suspect(route)
                    self.balancer.release(route)
                    held = None
                    remaining = max(0.001, timeout_s - (time.monotonic() - started))
                    # the same wait as the first: a replica with room now, or the first one freed
                    held = route = await self.balancer.acquire(
                        function_uid, namespace, timeout_s=remaining, lost=lost, wake=wake
                    )
        finally:
            if held is not None:
                self.balancer.release(held)
        return answer_body(answer, inv)


__all__ = ["REPLICA", "Balancer", "FunctionInvokeHandler"]
