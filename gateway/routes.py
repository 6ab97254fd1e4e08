"""The route cache: run uid → the host that serves it, fed only by host heartbeats.

A whole heartbeat is a full snapshot of one host incarnation (host uid), so applying it replaces
everything that host said before; a delta (what changed since the previous beat of the same
stream: registrations added or changed, run uids removed) is applied to what the host said, and
costs what it names, as does an empty delta (alive, nothing changed). A delta that does not
follow the beat applied before it on its stream, or whose host is no longer held, is refused
(`DeltaWithoutBase`): the host starts its stream again, whole. A host silent for `missed`
intervals is forgotten, and a host that announces `leaving` at once. A new incarnation of the
same host identity (same runtime and host id, new uid) replaces the old one. The invoke path only
reads this structure: no Temporal, no Kubernetes.

What a beat may claim (`apply`, with the identity of the certificate the beat came with):
- the beat is about the sending host itself: its host id and runtime are the certificate's, and
  its host uid is not another host's (else `HeartbeatRefused`, the whole beat);
- a registration becomes a route only if its signed assignment verifies (kruntimes.pki.assignments)
  and names that run, attempt, namespace, name and runtime, and the beat's host id and host uid;
  any other registration is skipped (counted in the result);
- the interval is held to [100 ms, MAX_INTERVAL_MS], so no beat keeps a route alive for long;
- after MAX_FAILED_VERIFICATIONS failed checks the rest of the beat's new registrations are
  skipped unchecked, so forged assignments cannot buy a host the gateway's CPU.

Verification costs one signature check per assignment not seen in the host's previous snapshot
(an unchanged registration is recognised by its assignment's bytes), done in batches that yield
the event loop, so a full snapshot of a big host neither blocks invokes nor costs a signature
check per registration per beat. A snapshot the same as the host's previous one (most beats of a
steady host) is recognised by a digest of its bytes, taken in one call, and only renews the
host's expiry: the Python work of a beat is proportional to what changed. `route` answers the
highest attempt among live hosts (ready first among equals): a newer assignment always wins over
an older one. Once an attempt above the first has been routed, no lower attempt of that Run is
routed again, even after every host of the newer attempt has gone: a host that was given an
earlier attempt (and may have kept its signed assignment) never gets the Run's invocations back
(the floors are kept for the MAX_FLOORS Runs that most recently moved).

A Function's replicas are Runs whose signed assignment names the Function's uid and revision: the
cache keeps an index function uid → its replicas' routes, changed wherever the per-run routes are
(so a snapshot, a delta, a host forgotten or leaving, a new incarnation, a route dropped each cost
what they change), and `function_routes` answers the routes `route` would answer for each replica.
A route carries its registration's async backlog and share (the target's asyncInvocations; a
Function's from its Ready replicas, `function_async_policy`), which the async accept and attempts
enforce. The cache remembers the last MAX_FUNCTIONS_SEEN Functions it ever indexed (uid →
namespace and name), so the invoke path tells a Function without a replica now (503) from one
never seen (404).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

from kruntimes.api.limits import MAX_ASYNC_BACKLOG
from kruntimes.pki import Identity, Role
from kruntimes.pki.assignments import AssignmentError, Verifier
from kruntimes.rpc.v1 import heartbeat_pb2 as hb
from kruntimes.rpc.v1 import runtime_pb2 as pb

MISSED_INTERVALS = 3
MAX_HOSTS = 10_000
MAX_REGISTRATIONS_PER_HOST = 100_000
MAX_FLOORS = 100_000  # Runs whose lowest routable attempt is remembered (those that moved)
MAX_FUNCTIONS_SEEN = 100_000  # Functions remembered after their last replica went (404 vs 503)
MIN_INTERVAL_MS = 100
MAX_INTERVAL_MS = 60_000
VERIFY_BATCH = 64  # signature checks between two yields of the event loop
# A beat whose assignments fail this often is hostile or broken: the rest of it is not checked.
MAX_FAILED_VERIFICATIONS = 64
_HOST_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_READY = pb.REGISTRATION_PHASE_READY


def _async_policy(r: pb.RegistrationState) -> tuple[int, int]:
    """A registration's async backlog and share, held to their bounds (a value past one is the
    host's bug: not said)."""
    backlog = r.async_backlog if r.async_backlog <= MAX_ASYNC_BACKLOG else 0
    share = r.async_share if r.async_share <= 100 else 0
    return backlog, share


def _interval_s(beat: hb.HostHeartbeat) -> float:
    return min(max(beat.interval_ms, MIN_INTERVAL_MS), MAX_INTERVAL_MS) / 1000.0


def _signed(assignment: pb.SignedAssignment) -> bytes:
    """Which signed assignment this is: a digest of its bytes and its signature."""
    h = hashlib.blake2b(assignment.signature, digest_size=16)
    h.update(assignment.assignment)
    return h.digest()


def _digest(beat: hb.HostHeartbeat) -> bytes:
    """What a snapshot says about routes (registrations, addresses), without its sequence, time
    and interval: equal digests, equal routes."""
    what = hb.HostHeartbeat(address=beat.address, invoke_address=beat.invoke_address)
    what.registrations.MergeFrom(beat.registrations)
    return hashlib.blake2b(what.SerializeToString(deterministic=True), digest_size=16).digest()


class HeartbeatRefused(Exception):
    """The beat is not the sending host's to make (another host's id, runtime or uid)."""


class DeltaWithoutBase(Exception):
    """A delta that does not follow what this cache holds of its host (a gap in its stream, or
    the host forgotten meanwhile): the host must start its stream again, whole."""


def _gone(before: dict[str, Route], after: dict[str, Route], beat: hb.HostHeartbeat) -> list[str]:
    """The run uids a delta took away from a host's routes: removed, or no longer routable."""
    named = [*beat.removed, *(r.run_uid for r in beat.registrations)]
    return [run_uid for run_uid in named if run_uid in before and run_uid not in after]


@dataclass(frozen=True, slots=True)
class Route:
    run_uid: str
    namespace: str
    name: str
    runtime: str
    registration_id: str
    attempt: int
    ready: bool
    host_id: str
    host_uid: str
    address: str
    invoke_address: str = ""  # the host's raw invoke port; empty: InvokeFunction over gRPC
    # a digest of the signed assignment (bytes and signature) that verified this route: an
    # unchanged registration is recognised by it (kept small: 10,000 routes cost kilobytes here)
    signed: bytes = b""
    # a Function's replica: the Function's uid and revision, from the verified assignment only
    function_uid: str = ""
    revision: int = 0
    concurrency: int = 1  # invocations the host runs at once for it (its RegistrationState)
    queue: int = 0  # invocations the host lets wait for it
    # the target's asyncInvocations backlog and share as its registration says them (0: not said,
    # a host older than them: the gateway's own bounds)
    async_backlog: int = 0
    async_share: int = 0

    @property
    def host(self) -> Identity:
        """The identity the host's certificate must name."""
        return Identity.host(runtime=self.runtime, host_id=self.host_id)


@dataclass(slots=True)
class _Host:
    identity: Identity
    address: str
    expires: float
    routes: dict[str, Route]
    digest: bytes = b""  # of the whole snapshot these routes came from (_digest); none after a delta
    unrouted: frozenset[str] = frozenset()  # the run uids of its registrations not routed
    stream: object | None = None  # the stream whose beats built this entry, as they said it


@dataclass(frozen=True, slots=True)
class SeenFunction:
    namespace: str
    name: str  # the Function's name, from its replicas' names ("" when they do not say it)


def function_name(replica: str, revision: int) -> str:
    """The Function's name in its replica Run's name `<function>-r<revision>-<5 hex>`; "" if the
    name is not of that shape."""
    head, sep, tail = replica.rpartition(f"-r{revision}-")
    if not sep or not head or len(tail) != 5 or not all(c in "0123456789abcdef" for c in tail):
        return ""
    return head


class RouteCache:
    def __init__(
        self,
        *,
        verifier: Verifier,
        clock: Callable[[], float] = time.monotonic,
        missed: int = MISSED_INTERVALS,
    ) -> None:
        self.verifier = verifier
        self._clock = clock
        self._missed = missed
        self._hosts: dict[str, _Host] = {}  # host uid → host
        self._incarnations: dict[Identity, str] = {}  # host identity → its current host uid
        # run uid → its route when one host holds it (nearly always), else host uid → route: a
        # dict for each of 10,000 Runs would cost more than the routes themselves
        self._routes: dict[str, Route | dict[str, Route]] = {}
        # run uid → the highest attempt routed for it, when above 1: no lower one is routed again
        self._floors: dict[str, int] = {}
        # function uid → {(run uid, host uid): route} of its replicas, and what was seen of it
        self._functions: dict[str, dict[tuple[str, str], Route]] = {}
        self._seen: OrderedDict[str, SeenFunction] = OrderedDict()
        # called with a function uid when one of its replicas' routes is added or becomes ready
        self.on_function_route: Callable[[str], None] | None = None

    def _sender(self, beat: hb.HostHeartbeat, peer: Identity) -> Identity:
        if peer.role is not Role.HOST or (peer.runtime, peer.host_id) != (beat.runtime, beat.host_id):
            raise HeartbeatRefused(f"{peer} may send heartbeats only about itself")
        if not _HOST_UID.fullmatch(beat.host_uid):
            raise HeartbeatRefused("the heartbeat's host uid is not an identifier")
        known = self._hosts.get(beat.host_uid)
        if known is not None and known.identity != peer:
            raise HeartbeatRefused(f"host uid {beat.host_uid} belongs to another host")
        return peer

    async def apply(
        self, beat: hb.HostHeartbeat, *, peer: Identity, stream: object | None = None, continues: bool = False
    ) -> int:
        """Apply one message from the host whose certificate names `peer`; returns how many of
        its registrations are not routed for want of a valid assignment. `stream`: a token of
        the stream the beat came on; `continues`: the beat follows, on that stream, the one
        applied just before it. A delta is applied only to what its own stream built, every beat
        of it in order: after anything else changed the host's entry (another stream, a route
        dropped) the stream starts again, whole. HeartbeatRefused if the beat is not `peer`'s to
        send; DeltaWithoutBase if it is a delta this cache cannot apply."""
        identity = self._sender(beat, peer)
        if beat.leaving:
            self.forget(beat.host_uid)
            return 0
        old = self._hosts.get(beat.host_uid)
        if beat.delta:
            if (
                not continues
                or stream is None
                or old is None
                or old.stream is not stream
                or self._incarnations.get(identity) != beat.host_uid
            ):
                raise DeltaWithoutBase(f"a delta from {beat.host_uid} without the message before it")
            if not beat.registrations and not beat.removed:  # alive, nothing changed
                old.expires = self._clock() + self._missed * _interval_s(beat)
                return len(old.unrouted)
            digest = b""  # a whole snapshot after deltas is applied in full
            routes = dict(old.routes)
            unrouted = set(old.unrouted)
            for run_uid in beat.removed[:MAX_REGISTRATIONS_PER_HOST]:
                routes.pop(run_uid, None)
                unrouted.discard(run_uid)
        else:
            digest = _digest(beat)
            if old is not None and old.digest == digest and self._incarnations.get(identity) == beat.host_uid:
                old.expires = self._clock() + self._missed * _interval_s(beat)
                old.stream = stream  # what it holds is what this stream said
                return len(old.unrouted)
            routes, unrouted = {}, set()
        previous = old.routes if old is not None else {}
        pending: list[pb.RegistrationState] = []
        address, invoke_address = beat.address, beat.invoke_address
        for r in beat.registrations[:MAX_REGISTRATIONS_PER_HOST]:
            prev = previous.get(r.run_uid)
            if (
                prev is not None
                and prev.signed == _signed(r.assignment)
                and prev.registration_id == r.registration_id
                and prev.address == address
                and prev.invoke_address == invoke_address
            ):
                ready, concurrency, queue = r.phase == _READY, max(1, r.concurrency), max(0, r.queue)
                backlog, share = _async_policy(r)
                same = (
                    prev.ready is ready
                    and prev.concurrency == concurrency
                    and prev.queue == queue
                    and prev.async_backlog == backlog
                    and prev.async_share == share
                )
                # keyed by the route's own uid string: the beat's copy is not kept as well
                routes[prev.run_uid] = (
                    prev
                    if same
                    else replace(
                        prev,
                        ready=ready,
                        concurrency=concurrency,
                        queue=queue,
                        async_backlog=backlog,
                        async_share=share,
                    )
                )
                unrouted.discard(r.run_uid)
            else:
                pending.append(r)
        failures = 0
        for i, r in enumerate(pending):
            route = None
            if failures < MAX_FAILED_VERIFICATIONS and len(routes) < MAX_REGISTRATIONS_PER_HOST:
                if i and i % VERIFY_BATCH == 0:
                    await asyncio.sleep(0)  # invokes run between the batches
                route = self._verified(beat, r)
                failures += route is None
            if route is None:  # the rest, once too many failed, unchecked
                routes.pop(r.run_uid, None)
                unrouted.add(r.run_uid)
            else:
                routes[route.run_uid] = route
                unrouted.discard(r.run_uid)
        if pending:  # the host may have changed while this snapshot was verified
            identity = self._sender(beat, peer)
            if beat.delta and self._hosts.get(beat.host_uid) is not old:
                raise DeltaWithoutBase(f"{beat.host_uid} was forgotten while its delta was applied")
        if len(unrouted) > MAX_REGISTRATIONS_PER_HOST:  # bounded like the routes
            unrouted = set(list(unrouted)[:MAX_REGISTRATIONS_PER_HOST])
        touched = None if not beat.delta else {r.run_uid for r in beat.registrations}
        self._commit(beat, identity, routes, digest=digest, unrouted=unrouted, touched=touched, stream=stream)
        return len(unrouted)

    def _verified(self, beat: hb.HostHeartbeat, r: pb.RegistrationState) -> Route | None:
        try:
            a = self.verifier.verify(r.assignment)
        except AssignmentError:
            return None
        if (a.run_uid, a.attempt, a.namespace, a.name, a.runtime, a.host_id, a.host_uid) != (
            r.run_uid,
            r.attempt,
            r.namespace,
            r.name,
            beat.runtime,
            beat.host_id,
            beat.host_uid,
        ) or (r.runtime != beat.runtime):
            return None
        backlog, share = _async_policy(r)
        # The strings every route of a host shares are kept once (interned), not once a route.
        return Route(
            run_uid=a.run_uid,
            namespace=sys.intern(a.namespace),
            name=a.name,
            runtime=sys.intern(a.runtime),
            registration_id=r.registration_id,
            attempt=a.attempt,
            ready=r.phase == _READY,
            host_id=sys.intern(a.host_id),
            host_uid=sys.intern(a.host_uid),
            address=sys.intern(beat.address),
            invoke_address=sys.intern(beat.invoke_address),
            signed=_signed(r.assignment),
            function_uid=sys.intern(a.function_uid),  # shared by the Function's replicas
            revision=a.revision,
            concurrency=max(1, r.concurrency),
            queue=max(0, r.queue),
            async_backlog=backlog,
            async_share=share,
        )

    def _commit(
        self,
        beat: hb.HostHeartbeat,
        identity: Identity,
        routes: dict[str, Route],
        *,
        digest: bytes = b"",
        unrouted: set[str] | None = None,
        touched: set[str] | None = None,
        stream: object | None = None,
    ) -> None:
        """Make `routes` the host's; `touched`: the run uids a delta changed (None: any may have
        changed, a whole snapshot), so a delta's commit costs what it changed."""
        host_uid = beat.host_uid
        earlier = self._incarnations.get(identity)
        if earlier is not None and earlier != host_uid:
            self.forget(earlier)  # a new incarnation of the same host
        old = self._hosts.get(host_uid)
        if old is None and len(self._hosts) >= MAX_HOSTS:
            return
        if old is not None:
            gone = old.routes.keys() - routes.keys() if touched is None else _gone(old.routes, routes, beat)
            for run_uid in gone:
                self._unlink(run_uid, host_uid)
        self._hosts[host_uid] = _Host(
            identity,
            beat.address,
            self._clock() + self._missed * _interval_s(beat),
            routes,
            digest,
            frozenset(unrouted or ()),
            stream,
        )
        self._incarnations[identity] = host_uid
        floors = self._floors
        for run_uid in routes if touched is None else touched & routes.keys():
            route = routes[run_uid]
            if route.attempt > 1 and route.attempt > floors.get(run_uid, 1):
                floors.pop(run_uid, None)  # re-inserted last: the oldest floors go first
                floors[run_uid] = route.attempt
                if len(floors) > MAX_FLOORS:
                    del floors[next(iter(floors))]
            held = self._routes.get(run_uid)
            if held is None or (isinstance(held, Route) and held.host_uid == host_uid):
                if held is not None and held.run_uid is not route.run_uid:
                    del self._routes[run_uid]  # an assignment keeps the old key: the old string
                self._routes[route.run_uid] = route  # keyed by the route's own uid string
                before = held
            elif isinstance(held, Route):
                self._routes[route.run_uid] = {held.host_uid: held, host_uid: route}
                before = None
            else:
                before = held.get(host_uid)
                held[host_uid] = route
            if before is not route and (route.function_uid or (before is not None and before.function_uid)):
                self._index(before, route)

    def forget(self, host_uid: str) -> None:
        host = self._hosts.pop(host_uid, None)
        if host is not None:
            if self._incarnations.get(host.identity) == host_uid:
                del self._incarnations[host.identity]
            for run_uid in host.routes:
                self._unlink(run_uid, host_uid)

    def _index(self, before: Route | None, route: Route | None) -> None:
        """The function index follows one (run, host) route from `before` to `route` (None: none)."""
        if (
            before is not None
            and before.function_uid
            and (route is None or route.function_uid != before.function_uid)
        ):
            replicas = self._functions.get(before.function_uid)
            if replicas is not None:
                replicas.pop((before.run_uid, before.host_uid), None)
                if not replicas:
                    del self._functions[before.function_uid]
        if route is None or not route.function_uid:
            return
        uid = route.function_uid
        replicas = self._functions.get(uid)
        if replicas is None:
            replicas = self._functions[uid] = {}
        replicas[(route.run_uid, route.host_uid)] = route
        seen = self._seen.get(uid)
        if seen is None or seen.namespace != route.namespace:
            seen = SeenFunction(route.namespace, function_name(route.name, route.revision))
        self._seen.pop(uid, None)  # re-inserted last: the longest unseen are forgotten first
        self._seen[uid] = seen
        if len(self._seen) > MAX_FUNCTIONS_SEEN:
            del self._seen[next(iter(self._seen))]
        if route.ready and (before is None or not before.ready) and self.on_function_route is not None:
            self.on_function_route(uid)

    def _unlink(self, run_uid: str, host_uid: str) -> None:
        held = self._routes.get(run_uid)
        if held is None:
            return
        if isinstance(held, Route):
            if held.host_uid == host_uid:
                del self._routes[run_uid]
                if held.function_uid:
                    self._index(held, None)
            return
        gone = held.pop(host_uid, None)
        if gone is not None and gone.function_uid:
            self._index(gone, None)
        if len(held) == 1:
            self._routes[run_uid] = next(iter(held.values()))
        elif not held:
            del self._routes[run_uid]

    def route(self, run_uid: str) -> Route | None:
        """The highest attempt among live hosts that hold the run (a ready one among equals); None
        if that attempt is below the highest ever routed for the run."""
        held = self._routes.get(run_uid)
        if held is None:
            return None
        now = self._clock()
        best: Route | None = None
        for route in (held,) if isinstance(held, Route) else tuple(held.values()):
            host = self._hosts.get(route.host_uid)
            if host is None or host.expires <= now:
                self.forget(route.host_uid)
                continue
            if best is None or (route.attempt, route.ready) > (best.attempt, best.ready):
                best = route
        if best is not None and best.attempt < self._floors.get(run_uid, 1):
            return None
        return best

    def function_routes(self, function_uid: str) -> list[Route]:
        """The route of each replica of the Function, as `route` answers it for the replica's Run
        (the highest attempt among live hosts, not below its floor); ready or not."""
        replicas = self._functions.get(function_uid)
        if not replicas:
            return []
        found: list[Route] = []
        runs = {run_uid for run_uid, _ in replicas}
        for run_uid in runs:
            route = self.route(run_uid)  # may forget an expired host, and so change `replicas`
            if route is not None and route.function_uid == function_uid:
                found.append(route)
        return found

    def function_async_policy(self, function_uid: str) -> tuple[int, int]:
        """The Function's async backlog and share as its Ready replicas' registrations say them
        (its template's; during a rollout, the latest revision's): (0, 0) when none says them."""
        said = [
            (route.revision, route.async_backlog, route.async_share)
            for route in self.function_routes(function_uid)
            if route.ready and (route.async_backlog or route.async_share)
        ]
        if not said:
            return 0, 0
        _, backlog, share = max(said)
        return backlog, share

    def seen_function(self, function_uid: str) -> SeenFunction | None:
        """What the cache last saw of the Function (its namespace and name), if it ever indexed one
        of its replicas (among the last MAX_FUNCTIONS_SEEN)."""
        return self._seen.get(function_uid)

    def functions(self) -> int:
        """How many Functions have a replica route now."""
        return len(self._functions)

    def drop(self, run_uid: str, host_uid: str) -> None:
        """The host refused this route (fence): forget it until its next heartbeat says otherwise."""
        host = self._hosts.get(host_uid)
        if host is not None:
            host.routes.pop(run_uid, None)
            host.digest = b""  # the next snapshot is applied in full, even if it did not change
            host.stream = None  # and no delta: the host's stream starts again, whole
        self._unlink(run_uid, host_uid)

    def sweep(self) -> int:
        now = self._clock()
        expired = [uid for uid, host in self._hosts.items() if host.expires <= now]
        for uid in expired:
            self.forget(uid)
        return len(expired)

    def hosts(self) -> int:
        return len(self._hosts)

    def __len__(self) -> int:
        return len(self._routes)
