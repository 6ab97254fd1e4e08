"""The route cache's Function index (gateway/routes.py), and the Balancer that reads it: a Function's replicas are the routes whose
verified assignment names its uid, kept through whole snapshots, deltas, hosts forgotten, leaving
or replaced by a new incarnation, dropped routes and attempt floors — always what the per-run
routes say, and a Function once seen is remembered (404 vs 503) after its last replica went.

The cache is the real one with the suite's assignment key; the heartbeats are the hosts' messages
(snapshots and deltas as runtime/heartbeat.py sends them), applied in process."""

from __future__ import annotations

import asyncio
import random
import uuid

import pytest

from kruntimes.gateway.errors import Busy, RunNotReady
from kruntimes.gateway.function_invoke import Balancer
from kruntimes.gateway.routes import RouteCache, function_name
from kruntimes.pki import Identity
from kruntimes.pki.assignments import SignedAssignment, Verifier
from kruntimes.rpc.v1 import heartbeat_pb2 as hb
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.wire.reasons import GatewayReason as R
from tests.support.pki import TestPKI
from tests.support.waiting import eventually

FUNCTION = str(uuid.uuid4())
OTHER_FUNCTION = str(uuid.uuid4())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def replica(
    pki: TestPKI,
    run_uid: str,
    *,
    host_id: str,
    host_uid: str,
    function_uid: str = FUNCTION,
    revision: int = 1,
    attempt: int = 1,
    ready: bool = True,
    concurrency: int = 2,
    signer: TestPKI | None = None,
) -> pb.RegistrationState:
    """A registration of a Function's replica Run (`function_uid` "": a plain Run)."""
    name = f"web-r{revision}-{run_uid[:5]}" if function_uid else "plain"
    assignment = SignedAssignment(
        run_uid=run_uid,
        attempt=attempt,
        host_id=host_id,
        host_uid=host_uid,
        namespace="default",
        name=name,
        runtime="python",
        function_uid=function_uid,
        revision=revision if function_uid else 0,
    )
    return pb.RegistrationState(
        run_uid=run_uid,
        attempt=attempt,
        namespace="default",
        name=name,
        runtime="python",
        registration_id=f"reg-{run_uid[:8]}-{attempt}",
        phase=pb.REGISTRATION_PHASE_READY if ready else pb.REGISTRATION_PHASE_NOT_READY,
        concurrency=concurrency,
        queue=3,
        assignment=(signer or pki).signer.sign(assignment),
    )


def snapshot(host_id: str, host_uid: str, *regs: pb.RegistrationState, sequence: int = 1) -> hb.HostHeartbeat:
    return hb.HostHeartbeat(
        host_id=host_id,
        host_uid=host_uid,
        runtime="python",
        address="127.0.0.1:1",
        sequence=sequence,
        interval_ms=1000,
        registrations=list(regs),
    )


def delta(
    host_id: str, host_uid: str, *regs: pb.RegistrationState, removed: tuple[str, ...] = (), sequence: int
) -> hb.HostHeartbeat:
    beat = snapshot(host_id, host_uid, *regs, sequence=sequence)
    beat.delta = True
    beat.removed.extend(removed)
    return beat


def peer(host_id: str) -> Identity:
    return Identity.host(runtime="python", host_id=host_id)


def replicas(cache: RouteCache, function_uid: str = FUNCTION) -> dict[str, tuple[str, bool]]:
    """run uid → (host uid, ready) of the Function's routes."""
    return {r.run_uid: (r.host_uid, r.ready) for r in cache.function_routes(function_uid)}


def assert_index_is_the_routes(cache: RouteCache) -> None:
    """The index holds exactly the hosts' routes that name a Function, each under its uid."""
    expected: dict[str, set[tuple[str, str]]] = {}
    for host in cache._hosts.values():
        for route in host.routes.values():
            if route.function_uid:
                expected.setdefault(route.function_uid, set()).add((route.run_uid, route.host_uid))
    held = {uid: set(routes) for uid, routes in cache._functions.items()}
    assert held == expected
    for uid, routes in cache._functions.items():
        assert all(r.function_uid == uid for r in routes.values())


async def test_the_index_follows_snapshots_deltas_hosts_and_floors(pki: TestPKI) -> None:
    clock = Clock()
    cache = RouteCache(verifier=Verifier([pki.signer.public_key]), clock=clock)
    appeared: list[str] = []
    cache.on_function_route = appeared.append
    r1, r2, r3, r4, plain = (str(uuid.uuid4()) for _ in range(5))
    stream0, stream1 = object(), object()

    # a whole snapshot: two replicas and a plain Run
    await cache.apply(
        snapshot(
            "h-0",
            "u-0",
            replica(pki, r1, host_id="h-0", host_uid="u-0"),
            replica(pki, r2, host_id="h-0", host_uid="u-0"),
            replica(pki, plain, host_id="h-0", host_uid="u-0", function_uid=""),
        ),
        peer=peer("h-0"),
        stream=stream0,
    )
    assert replicas(cache) == {r1: ("u-0", True), r2: ("u-0", True)}
    assert appeared == [FUNCTION, FUNCTION]
    route = cache.function_routes(FUNCTION)[0]
    assert (route.revision, route.concurrency, route.queue) == (1, 2, 3)
    seen = cache.seen_function(FUNCTION)
    assert seen is not None and (seen.namespace, seen.name) == ("default", "web")
    assert cache.route(plain) is not None and cache.route(plain).function_uid == ""  # type: ignore[union-attr]
    assert cache.functions() == 1
    assert_index_is_the_routes(cache)

    # the same snapshot again: nothing changes, nothing appears again
    await cache.apply(
        snapshot(
            "h-0",
            "u-0",
            replica(pki, r1, host_id="h-0", host_uid="u-0"),
            replica(pki, r2, host_id="h-0", host_uid="u-0"),
            replica(pki, plain, host_id="h-0", host_uid="u-0", function_uid=""),
            sequence=2,
        ),
        peer=peer("h-0"),
        stream=stream0,
        continues=True,
    )
    assert appeared == [FUNCTION, FUNCTION]

    # a delta: r2 removed, r3 added not ready, r1 no longer ready
    await cache.apply(
        delta(
            "h-0",
            "u-0",
            replica(pki, r1, host_id="h-0", host_uid="u-0", ready=False),
            replica(pki, r3, host_id="h-0", host_uid="u-0", ready=False),
            removed=(r2,),
            sequence=3,
        ),
        peer=peer("h-0"),
        stream=stream0,
        continues=True,
    )
    assert replicas(cache) == {r1: ("u-0", False), r3: ("u-0", False)}
    assert appeared == [FUNCTION, FUNCTION]  # nothing became ready
    assert_index_is_the_routes(cache)

    # r3 becomes ready (a delta naming it only): it appears
    await cache.apply(
        delta("h-0", "u-0", replica(pki, r3, host_id="h-0", host_uid="u-0"), sequence=4),
        peer=peer("h-0"),
        stream=stream0,
        continues=True,
    )
    assert replicas(cache) == {r1: ("u-0", False), r3: ("u-0", True)}
    assert appeared == [FUNCTION, FUNCTION, FUNCTION]

    # a second host with r4 and r1's next attempt: r1 is routed there from now on
    await cache.apply(
        snapshot(
            "h-1",
            "u-1",
            replica(pki, r4, host_id="h-1", host_uid="u-1"),
            replica(pki, r1, host_id="h-1", host_uid="u-1", attempt=2),
        ),
        peer=peer("h-1"),
        stream=stream1,
    )
    assert replicas(cache) == {r1: ("u-1", True), r3: ("u-0", True), r4: ("u-1", True)}
    assert_index_is_the_routes(cache)

    # the second host leaves: r4 goes, and r1 is not routed back to its first attempt (its floor)
    leaving = snapshot("h-1", "u-1", sequence=2)
    leaving.leaving = True
    await cache.apply(leaving, peer=peer("h-1"), stream=stream1, continues=True)
    assert replicas(cache) == {r3: ("u-0", True)}
    assert_index_is_the_routes(cache)

    # a new incarnation of h-0 holding only r3: the old one's routes are gone with it
    await cache.apply(
        snapshot("h-0", "u-0b", replica(pki, r3, host_id="h-0", host_uid="u-0b")),
        peer=peer("h-0"),
        stream=object(),
    )
    assert replicas(cache) == {r3: ("u-0b", True)}
    assert "u-0" not in cache._hosts
    assert_index_is_the_routes(cache)

    # a route the host refused (fence) is dropped from the index too
    cache.drop(r3, "u-0b")
    assert replicas(cache) == {}
    assert cache.functions() == 0
    assert_index_is_the_routes(cache)

    # back, then silent: the sweep forgets the host, the Function stays seen (503, not 404)
    await cache.apply(
        snapshot("h-0", "u-0b", replica(pki, r3, host_id="h-0", host_uid="u-0b"), sequence=5),
        peer=peer("h-0"),
        stream=object(),
    )
    assert replicas(cache) == {r3: ("u-0b", True)}
    clock.now += 60
    assert replicas(cache) == {}  # an expired host is no route even before the sweep
    cache.sweep()
    assert cache.functions() == 0 and cache._functions == {}
    assert cache.seen_function(FUNCTION) is not None
    assert cache.seen_function(OTHER_FUNCTION) is None


async def test_only_a_verified_assignment_makes_a_replica(pki: TestPKI, tmp_path_factory: object) -> None:
    """A registration whose assignment is not the control plane's (another key) is no replica,
    whatever Function it names; one naming another host is none either."""
    other = TestPKI.create(tmp_path_factory.mktemp("other-ca"))  # type: ignore[attr-defined]
    cache = RouteCache(verifier=Verifier([pki.signer.public_key]))
    forged, elsewhere, genuine = (str(uuid.uuid4()) for _ in range(3))
    skipped = await cache.apply(
        snapshot(
            "h-0",
            "u-0",
            replica(pki, forged, host_id="h-0", host_uid="u-0", signer=other),
            replica(pki, elsewhere, host_id="h-9", host_uid="u-9"),
            replica(pki, genuine, host_id="h-0", host_uid="u-0", function_uid=OTHER_FUNCTION),
        ),
        peer=peer("h-0"),
    )
    assert skipped == 2
    assert replicas(cache) == {}
    assert cache.seen_function(FUNCTION) is None
    assert replicas(cache, OTHER_FUNCTION) == {genuine: ("u-0", True)}


async def test_the_index_is_the_routes_through_a_random_stream_of_beats(pki: TestPKI) -> None:
    """Two Functions' replicas and plain Runs over three hosts: snapshots, deltas, leavings, new
    incarnations and drops in a random order; after each, the index is what the routes say and
    each replica's route is `route`'s."""
    rng = random.Random(43)
    cache = RouteCache(verifier=Verifier([pki.signer.public_key]))
    functions = (FUNCTION, OTHER_FUNCTION, "")
    runs = [(str(uuid.uuid4()), functions[i % 3]) for i in range(24)]
    hosts = {f"h-{i}": f"u-{i}-0" for i in range(3)}
    held: dict[str, dict[str, pb.RegistrationState]] = {h: {} for h in hosts}
    streams: dict[str, object] = {}
    sequence: dict[str, int] = dict.fromkeys(hosts, 0)
    for step in range(300):
        host_id = rng.choice(list(hosts))
        host_uid = hosts[host_id]
        action = rng.random()
        if action < 0.05:  # a new incarnation: nothing held, a new stream
            hosts[host_id] = host_uid = f"u-{host_id[2:]}-{step}"
            held[host_id] = {}
            streams.pop(host_id, None)
        elif action < 0.1:  # the host leaves
            beat = snapshot(host_id, host_uid, sequence=sequence[host_id] + 1)
            beat.leaving = True
            await cache.apply(beat, peer=peer(host_id))
            held[host_id] = {}
            streams.pop(host_id, None)
            continue
        elif action < 0.15 and held[host_id]:  # a route refused by the host
            cache.drop(rng.choice(list(held[host_id])), host_uid)
            streams.pop(host_id, None)  # the host's next beat is whole
            assert_index_is_the_routes(cache)
            continue
        changed: list[pb.RegistrationState] = []
        removed: list[str] = []
        for _ in range(rng.randint(1, 4)):
            run_uid, function_uid = rng.choice(runs)
            if run_uid in held[host_id] and rng.random() < 0.4:
                del held[host_id][run_uid]
                removed.append(run_uid)
            else:
                reg = replica(
                    pki,
                    run_uid,
                    host_id=host_id,
                    host_uid=host_uid,
                    function_uid=function_uid,
                    attempt=1,
                    ready=rng.random() < 0.7,
                )
                held[host_id][run_uid] = reg
                changed.append(reg)
        sequence[host_id] += 1
        stream = streams.get(host_id)
        if stream is not None and rng.random() < 0.7:
            beat = delta(
                host_id,
                host_uid,
                *changed,
                removed=tuple(r for r in removed if r not in held[host_id]),
                sequence=sequence[host_id],
            )
            await cache.apply(beat, peer=peer(host_id), stream=stream, continues=True)
        else:
            stream = streams[host_id] = object()
            beat = snapshot(host_id, host_uid, *held[host_id].values(), sequence=sequence[host_id])
            await cache.apply(beat, peer=peer(host_id), stream=stream)
        assert_index_is_the_routes(cache)
        for function_uid in (FUNCTION, OTHER_FUNCTION):
            for route in cache.function_routes(function_uid):
                assert cache.route(route.run_uid) == route


def test_the_functions_name_is_read_from_its_replicas_names() -> None:
    assert function_name("web-r3-0a1b2", 3) == "web"
    assert function_name("my-api-r12-fffff", 12) == "my-api"
    assert function_name("web-r3-0a1b2", 4) == ""  # another revision
    assert function_name("web-r3-0A1B2", 3) == ""
    assert function_name("-r3-0a1b2", 3) == ""
    assert function_name("plain", 1) == ""


async def test_the_balancer_keeps_its_bounds_over_the_real_route_cache(pki: TestPKI) -> None:
    """gateway/function_invoke.py's Balancer on the real cache: never past a replica's
    concurrency, the global bound over every Function's waits, a wait that times out leaves the
    queue, and a freed slot goes to the first waiter of that Function."""
    cache = RouteCache(verifier=Verifier([pki.signer.public_key]))
    balancer = Balancer(cache, max_waiting_per_function=10, max_waiting=2, warmup_s=0)
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    await cache.apply(
        snapshot(
            "h-0",
            "u-0",
            replica(pki, a, host_id="h-0", host_uid="u-0", concurrency=1),
            replica(pki, b, host_id="h-0", host_uid="u-0", function_uid=OTHER_FUNCTION, concurrency=1),
        ),
        peer=peer("h-0"),
    )
    never = asyncio.get_running_loop().create_future()
    taken = await balancer.acquire(FUNCTION, "default", timeout_s=1, lost=never)
    assert taken.run_uid == a and balancer.choose(FUNCTION, "default") is None  # full: no second
    with_b = await balancer.acquire(OTHER_FUNCTION, "default", timeout_s=1, lost=never)
    with pytest.raises(RunNotReady) as no_replica:
        await balancer.acquire(FUNCTION, "other-namespace", timeout_s=1, lost=never)
    assert no_replica.value.reason is R.NO_READY_REPLICA

    first = asyncio.create_task(balancer.acquire(FUNCTION, "default", timeout_s=30, lost=never))
    second = asyncio.create_task(balancer.acquire(OTHER_FUNCTION, "default", timeout_s=30, lost=never))
    await eventually(lambda: balancer.waiting() == 2, what="two waiting")
    with pytest.raises(Busy) as full:  # the global bound, though this Function's is not reached
        await balancer.acquire(FUNCTION, "default", timeout_s=30, lost=never)
    assert full.value.reason is R.REPLICAS_FULL

    second.cancel()  # a waiter that goes away leaves the queue
    await eventually(lambda: balancer.waiting() == 1, what="the cancelled wait gone")
    with pytest.raises(Busy) as timed_out:
        await balancer.acquire(FUNCTION, "default", timeout_s=0.05, lost=never)
    assert timed_out.value.reason is R.QUEUE_TIMEOUT
    assert balancer.waiting() == 1 and balancer.waiting(FUNCTION) == 1

    balancer.release(taken)  # the slot goes to the first waiter, at once
    assert (await first).run_uid == a and balancer.in_flight(a) == 1
    balancer.release(taken)
    balancer.release(with_b)
    assert balancer.in_flight(a) == balancer.in_flight(b) == 0 and balancer.waiting() == 0


async def test_the_balancer_honours_a_traffic_split_and_never_refuses_for_it(pki: TestPKI) -> None:
    """A Function split 80/20 between revisions 1 and 2 (as the known-Functions view reads its
    KrtTraffic): each invocation draws a revision by its percent (seeded here), then the fewest in
    flight within it; a revision without a Ready replica with room takes nothing and the other
    takes the invocation; a split naming no revision with a replica changes nothing."""
    from kruntimes.temporal.known_functions import KnownFunction, KnownFunctions

    cache = RouteCache(verifier=Verifier([pki.signer.public_key]))
    balancer = Balancer(cache, warmup_s=0, rng=random.Random(43))
    old, new_a, new_b = (str(uuid.uuid4()) for _ in range(3))
    await cache.apply(
        snapshot(
            "h-0",
            "u-0",
            replica(pki, old, host_id="h-0", host_uid="u-0", revision=1, concurrency=1),
            replica(pki, new_a, host_id="h-0", host_uid="u-0", revision=2, concurrency=1),
            replica(pki, new_b, host_id="h-0", host_uid="u-0", revision=2, concurrency=1),
        ),
        peer=peer("h-0"),
    )
    view = KnownFunctions(None)
    balancer.functions = view

    def known(traffic: tuple[tuple[int, int], ...], namespace: str = "default") -> None:
        view.entries[FUNCTION] = KnownFunction(
            namespace=namespace, name="web", phase="Ready", traffic=traffic
        )

    def picks(n: int) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _ in range(n):
            route = balancer.choose(FUNCTION, "default")
            assert route is not None
            counts[route.run_uid] = counts.get(route.run_uid, 0) + 1
            balancer.release(route)
        return counts

    known(((1, 80), (2, 20)))
    n = 10_000
    counts = picks(n)
    share = (counts.get(new_a, 0) + counts.get(new_b, 0)) / n
    assert abs(share - 0.2) <= 4.5 * (0.2 * 0.8 / n) ** 0.5, counts  # a binomial bound
    assert abs(counts[new_a] - counts[new_b]) <= 1, counts  # within revision 2, in turn

    held = balancer.choose(FUNCTION, "default")  # revision 1's only replica taken...
    while held is not None and held.run_uid != old:
        balancer.release(held)
        held = balancer.choose(FUNCTION, "default")
    assert held is not None
    assert set(picks(200)) <= {new_a, new_b}  # ...revision 2 takes every invocation meanwhile
    balancer.release(held)

    known(((1, 0), (2, 100)))
    a, b = balancer.choose(FUNCTION, "default"), balancer.choose(FUNCTION, "default")
    assert a is not None and b is not None and {a.run_uid, b.run_uid} == {new_a, new_b}
    third = balancer.choose(FUNCTION, "default")  # revision 2 full: 0% is still not a refusal
    assert third is not None and third.run_uid == old
    assert balancer.choose(FUNCTION, "default") is None  # every replica full
    for route in (a, b, third):
        balancer.release(route)

    for ignored in (((7, 50), (8, 50)), ()):  # no revision of it has a replica, or no split
        known(ignored)
        assert picks(300) == {old: 100, new_a: 100, new_b: 100}
    known(((1, 100),), namespace="elsewhere")  # another namespace's view of the uid: not this split
    assert picks(300) == {old: 100, new_a: 100, new_b: 100}
