"""The route cache on its own (gateway/routes.py): what a snapshot may claim, which route wins, and
that verification costs one signature check per new assignment — and no more for a forger."""

from __future__ import annotations

import uuid

import pytest

from kruntimes.gateway.routes import MAX_FAILED_VERIFICATIONS, DeltaWithoutBase, HeartbeatRefused, RouteCache
from kruntimes.pki import Identity
from kruntimes.pki.assignments import Verifier
from kruntimes.rpc.v1 import heartbeat_pb2 as hb
from kruntimes.rpc.v1 import runtime_pb2 as pb
from tests.support.beats import heartbeat, registration
from tests.support.pki import TestPKI

HOST = Identity.host(runtime="python", host_id="h-0")


class CountingVerifier(Verifier):
    """Counts the signatures it is asked to check (a cache hit counts too)."""

    calls = 0

    def verify(self, signed: pb.SignedAssignment):  # type: ignore[no-untyped-def]
        self.calls += 1
        return super().verify(signed)


def beat(host_uid: str, *registrations: pb.RegistrationState) -> hb.HostHeartbeat:
    return heartbeat(host_uid=host_uid, address="127.0.0.1:1", registrations=registrations)


@pytest.fixture
def verifier(pki: TestPKI) -> CountingVerifier:
    return CountingVerifier([pki.signer.public_key])


async def test_only_new_assignments_are_checked(pki: TestPKI, verifier: CountingVerifier) -> None:
    routes = RouteCache(verifier=verifier)
    host_uid = str(uuid.uuid4())
    regs = [registration(pki, str(uuid.uuid4()), host_uid=host_uid) for _ in range(10)]
    assert await routes.apply(beat(host_uid, *regs), peer=HOST) == 0
    assert verifier.calls == 10 and len(routes) == 10
    assert await routes.apply(beat(host_uid, *regs), peer=HOST) == 0
    assert verifier.calls == 10, "an unchanged snapshot checks nothing"
    regs[0] = registration(pki, regs[0].run_uid, host_uid=host_uid, attempt=2)
    assert await routes.apply(beat(host_uid, *regs), peer=HOST) == 0
    assert verifier.calls == 11
    assert routes.route(regs[0].run_uid).attempt == 2  # type: ignore[union-attr]


async def test_a_forger_gets_a_bounded_number_of_checks(
    pki: TestPKI, verifier: CountingVerifier, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    forger = TestPKI.create(tmp_path / "forger")
    forger.signer.key_id = pki.signer.key_id  # claims the platform's key: every check is a real one
    routes = RouteCache(verifier=verifier)
    host_uid = str(uuid.uuid4())
    forged = [registration(pki, str(uuid.uuid4()), host_uid=host_uid, signer=forger) for _ in range(500)]
    skipped = await routes.apply(beat(host_uid, *forged), peer=HOST)
    assert skipped == 500 and len(routes) == 0
    assert verifier.calls == MAX_FAILED_VERIFICATIONS


async def test_a_beat_about_another_host_is_refused_whole(pki: TestPKI, verifier: CountingVerifier) -> None:
    routes = RouteCache(verifier=verifier)
    host_uid = str(uuid.uuid4())
    await routes.apply(beat(host_uid, registration(pki, str(uuid.uuid4()), host_uid=host_uid)), peer=HOST)
    other = Identity.host(runtime="python", host_id="h-1")
    with pytest.raises(HeartbeatRefused):
        await routes.apply(beat(host_uid), peer=other)  # h-1 claiming to be h-0
    impostor = beat(host_uid)
    impostor.host_id = "h-1"  # its own id, h-0's incarnation
    with pytest.raises(HeartbeatRefused):
        await routes.apply(impostor, peer=other)
    assert len(routes) == 1 and routes.hosts() == 1


async def test_an_unchanged_snapshot_only_renews_its_host(pki: TestPKI, verifier: CountingVerifier) -> None:
    """The work of a beat is proportional to what changed: the same snapshot again (a later
    sequence and time) keeps the very same routes and only moves the host's expiry."""
    now = [0.0]
    routes = RouteCache(verifier=verifier, clock=lambda: now[0])
    host_uid = str(uuid.uuid4())
    regs = [registration(pki, str(uuid.uuid4()), host_uid=host_uid) for _ in range(50)]
    first = beat(host_uid, *regs)
    assert await routes.apply(first, peer=HOST) == 0
    kept = {r.run_uid: routes.route(r.run_uid) for r in regs}
    for i in range(1, 4):  # each beat within the expiry of the one before
        now[0] = 2.5 * i
        again = beat(host_uid, *regs)
        again.sequence = i
        again.sent_at.GetCurrentTime()
        assert await routes.apply(again, peer=HOST) == 0
    assert verifier.calls == 50
    assert all(routes.route(uid) is route for uid, route in kept.items()), "the same route objects"
    not_ready = pb.RegistrationState()
    not_ready.CopyFrom(regs[0])
    not_ready.phase = pb.REGISTRATION_PHASE_NOT_READY
    assert await routes.apply(beat(host_uid, not_ready, *regs[1:]), peer=HOST) == 0
    assert verifier.calls == 50, "a changed phase is no new assignment"
    assert routes.route(regs[0].run_uid).ready is False  # type: ignore[union-attr]
    now[0] += 3.5  # silent past three intervals: gone, however often it said the same
    assert routes.route(regs[1].run_uid) is None


async def test_a_run_held_by_two_hosts_routes_to_the_live_highest_attempt(
    pki: TestPKI, verifier: CountingVerifier
) -> None:
    """A Run moving between hosts is held by both for a while: the highest attempt of a live host
    wins, and once that host lets it go (drops it, falls silent) the earlier attempt is not
    routed again; the route cache keeps each Run as one route or, while two hosts hold it, both."""
    now = [0.0]
    routes = RouteCache(verifier=verifier, clock=lambda: now[0])
    uid, old_uid, new_uid = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    new_host = Identity.host(runtime="python", host_id="h-1")

    def old_beat(*regs: pb.RegistrationState) -> hb.HostHeartbeat:
        return beat(old_uid, *regs)

    def new_beat(*regs: pb.RegistrationState) -> hb.HostHeartbeat:
        return heartbeat(host_uid=new_uid, host_id="h-1", address="127.0.0.1:2", registrations=regs)

    first = registration(pki, uid, host_uid=old_uid)
    second = registration(pki, uid, host_uid=new_uid, host_id="h-1", attempt=2)
    await routes.apply(old_beat(first), peer=HOST)
    assert routes.route(uid).host_uid == old_uid  # type: ignore[union-attr]
    await routes.apply(new_beat(second), peer=new_host)
    assert len(routes) == 1
    assert (routes.route(uid).attempt, routes.route(uid).host_uid) == (2, new_uid)  # type: ignore[union-attr]
    routes.drop(uid, new_uid)  # the new host refused it (fence): the earlier attempt is not routed
    assert routes.route(uid) is None
    await routes.apply(new_beat(second), peer=new_host)  # its next beat holds it again
    assert routes.route(uid).host_uid == new_uid  # type: ignore[union-attr]
    await routes.apply(old_beat(), peer=HOST)  # the old host let it go
    assert routes.route(uid).host_uid == new_uid and len(routes) == 1  # type: ignore[union-attr]
    await routes.apply(old_beat(first), peer=HOST)  # a lower attempt again: the higher one wins
    now[0] = 2.5
    await routes.apply(old_beat(first), peer=HOST)  # only the old host beats on
    assert routes.route(uid).host_uid == new_uid  # type: ignore[union-attr]
    now[0] = 3.5  # the new host silent past three intervals: forgotten, the old attempt not routed
    assert routes.route(uid) is None and routes.hosts() == 1 and len(routes) == 1
    leaving = old_beat()
    leaving.leaving = True
    await routes.apply(leaving, peer=HOST)
    assert routes.route(uid) is None and len(routes) == 0 and routes.hosts() == 0


def delta(
    host_uid: str, sequence: int, *changed: pb.RegistrationState, removed: tuple[str, ...] = ()
) -> hb.HostHeartbeat:
    message = beat(host_uid, *changed)
    message.sequence, message.delta = sequence, True
    message.removed.extend(removed)
    return message


async def test_a_delta_changes_only_what_it_names(pki: TestPKI, verifier: CountingVerifier) -> None:
    """A stream's deltas cost what they name: an empty one renews the host, one with a new
    registration checks that one, a removal takes exactly that route away."""
    now = [0.0]
    routes = RouteCache(verifier=verifier, clock=lambda: now[0])
    host_uid = str(uuid.uuid4())
    stream = object()
    regs = [registration(pki, str(uuid.uuid4()), host_uid=host_uid) for _ in range(20)]
    whole = beat(host_uid, *regs)
    whole.sequence = 1
    assert await routes.apply(whole, peer=HOST, stream=stream) == 0
    kept = {r.run_uid: routes.route(r.run_uid) for r in regs}
    now[0] = 2.5
    assert await routes.apply(delta(host_uid, 2), peer=HOST, stream=stream, continues=True) == 0
    now[0] = 5.0  # past the whole beat's expiry: the empty delta renewed it
    assert all(routes.route(uid) is route for uid, route in kept.items())
    added = registration(pki, str(uuid.uuid4()), host_uid=host_uid)
    moved = registration(pki, regs[0].run_uid, host_uid=host_uid, attempt=2)
    changes = delta(host_uid, 3, added, moved, removed=(regs[1].run_uid,))
    assert await routes.apply(changes, peer=HOST, stream=stream, continues=True) == 0
    assert verifier.calls == 22, "the two named registrations were checked, nothing else"
    assert routes.route(added.run_uid) is not None
    assert routes.route(regs[0].run_uid).attempt == 2  # type: ignore[union-attr]
    assert routes.route(regs[1].run_uid) is None
    assert all(routes.route(r.run_uid) is kept[r.run_uid] for r in regs[2:])
    assert len(routes) == 20


async def test_a_delta_without_its_base_is_refused_and_changes_nothing(
    pki: TestPKI, verifier: CountingVerifier
) -> None:
    routes = RouteCache(verifier=verifier)
    host_uid = str(uuid.uuid4())
    stream, other = object(), object()
    reg = registration(pki, str(uuid.uuid4()), host_uid=host_uid)
    gone = delta(host_uid, 2, removed=(reg.run_uid,))
    with pytest.raises(DeltaWithoutBase):  # the host is not known: nothing to apply it to
        await routes.apply(gone, peer=HOST, stream=stream, continues=True)
    whole = beat(host_uid, reg)
    whole.sequence = 1
    await routes.apply(whole, peer=HOST, stream=stream)
    with pytest.raises(DeltaWithoutBase):  # a gap in the stream
        await routes.apply(gone, peer=HOST, stream=stream, continues=False)
    with pytest.raises(DeltaWithoutBase):  # another stream built what the cache holds
        await routes.apply(gone, peer=HOST, stream=other, continues=True)
    routes.drop(reg.run_uid, host_uid)  # the gateway changed the entry on its own
    with pytest.raises(DeltaWithoutBase):
        await routes.apply(delta(host_uid, 2), peer=HOST, stream=stream, continues=True)
    await routes.apply(whole, peer=HOST, stream=stream)  # starting again, whole, mends it
    assert routes.route(reg.run_uid) is not None
    forger = delta(host_uid, 2, removed=(reg.run_uid,))
    with pytest.raises(HeartbeatRefused):  # a delta is refused for another host like a whole beat
        await routes.apply(
            forger, peer=Identity.host(runtime="python", host_id="h-1"), stream=stream, continues=True
        )
    assert routes.route(reg.run_uid) is not None
