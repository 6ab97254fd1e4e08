"""Who may feed the route cache: heartbeats only from hosts of the platform CA, each only about
itself, and only registrations whose signed assignment verifies become routes. Each test is an
attack on the real gateway's heartbeat port that must fail for the attacker."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import aiohttp
import grpc
import pytest

from kruntimes.gateway.server import Gateway
from kruntimes.pki import Identity, PeerTLS, Role
from kruntimes.rpc.v1 import heartbeat_pb2 as hb
from kruntimes.rpc.v1 import heartbeat_pb2_grpc as hb_grpc
from kruntimes.rpc.v1 import runtime_pb2 as pb
from tests.gateway.conftest import BOB, HostProcess, invoke
from tests.support.beats import heartbeat, registration
from tests.support.pki import CONTROL_PLANE, GATEWAY, TestPKI

ECHO = """
def handle(payload):
    return payload
"""


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> TestPKI:
    return TestPKI.create(tmp_path_factory.mktemp("other-ca"))


def beat(host_id: str, host_uid: str, address: str, *registrations: pb.RegistrationState) -> hb.HostHeartbeat:
    return heartbeat(
        host_id=host_id,
        host_uid=host_uid,
        address=address,
        invoke_address=address,
        sequence=1,
        interval_ms=3_600_000,  # an hour: held to the gateway's maximum
        registrations=registrations,
    )


def own(
    pki: TestPKI, host_id: str, host_uid: str, uid: str, *, attempt: int = 1, address: str = "127.0.0.1:1"
) -> hb.HostHeartbeat:
    """A host's beat announcing its own genuine (signed) assignment of Run `uid`."""
    return beat(
        host_id,
        host_uid,
        address,
        registration(pki, uid, host_id=host_id, host_uid=host_uid, attempt=attempt),
    )


async def send(gw: Gateway, tls: PeerTLS | None, *beats: hb.HostHeartbeat) -> hb.HeartbeatAck:
    """One heartbeat stream to the gateway presenting `tls` (None: plaintext)."""

    async def stream() -> AsyncIterator[hb.HostHeartbeat]:
        for b in beats:
            yield b

    if tls is None:
        channel = grpc.aio.insecure_channel(gw.heartbeat_address)
    else:
        channel = grpc.aio.secure_channel(
            gw.heartbeat_address, tls.channel_credentials(), options=tls.channel_options(Role.GATEWAY)
        )
    async with channel:
        ack: hb.HeartbeatAck = await hb_grpc.RouteHeartbeatStub(channel).Heartbeats(stream(), timeout=10)
        return ack


async def refused(gw: Gateway, tls: PeerTLS | None, *beats: hb.HostHeartbeat) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await send(gw, tls, *beats)
    return caught.value.code()


def host(pki: TestPKI, host_id: str) -> PeerTLS:
    return pki.peer(Identity.host(runtime="python", host_id=host_id))


async def test_plaintext_and_foreign_clients_are_refused_on_the_heartbeat_port(
    gateway: Gateway, pki: TestPKI, other_ca: TestPKI
) -> None:
    uid = str(uuid.uuid4())
    host_uid = str(uuid.uuid4())
    forged = own(pki, "hb-x", host_uid, uid)
    assert await refused(gateway, None, forged) == grpc.StatusCode.UNAVAILABLE
    impostor = pki.impostor(other_ca, Identity.host(runtime="python", host_id="hb-x"))
    assert await refused(gateway, impostor, forged) == grpc.StatusCode.UNAVAILABLE
    for invalid in (pki.expired, pki.not_yet_valid):
        code = await refused(gateway, invalid(Identity.host(runtime="python", host_id="hb-x")), forged)
        assert code == grpc.StatusCode.UNAVAILABLE, invalid
    assert gateway.routes.route(uid) is None
    # the same beat with the host's own certificate is taken: the refusals were the certificates'
    assert (await send(gateway, host(pki, "hb-x"), forged)).last_sequence == 1
    assert gateway.routes.route(uid) is not None
    gateway.routes.forget(host_uid)


@pytest.mark.parametrize("identity", [GATEWAY, CONTROL_PLANE], ids=["gateway", "control-plane"])
async def test_only_hosts_may_send_heartbeats(gateway: Gateway, pki: TestPKI, identity: Identity) -> None:
    uid, host_uid = str(uuid.uuid4()), str(uuid.uuid4())
    forged = own(pki, "hb-y", host_uid, uid)
    assert await refused(gateway, pki.peer(identity), forged) == grpc.StatusCode.PERMISSION_DENIED
    assert gateway.routes.route(uid) is None


async def test_a_host_cannot_send_beats_for_another_host_id_or_runtime(
    gateway: Gateway, client: aiohttp.ClientSession, main_host: HostProcess, echo: object, pki: TestPKI
) -> None:
    real = gateway.routes.route(echo.uid)  # type: ignore[attr-defined]
    assert real is not None
    evil = host(pki, "hb-evil")
    # the victim's id with no registrations: would have emptied its routes
    empty = beat(main_host.host_id, main_host.host_uid, "127.0.0.1:1")
    assert await refused(gateway, evil, empty) == grpc.StatusCode.PERMISSION_DENIED
    leaving = beat(main_host.host_id, main_host.host_uid, "127.0.0.1:1")
    leaving.leaving = True
    assert await refused(gateway, evil, leaving) == grpc.StatusCode.PERMISSION_DENIED
    # its own id, but the victim's host uid (its incarnation): refused too
    stolen = beat("hb-evil", main_host.host_uid, "127.0.0.1:1")
    assert await refused(gateway, evil, stolen) == grpc.StatusCode.PERMISSION_DENIED
    stolen.leaving = True
    assert await refused(gateway, evil, stolen) == grpc.StatusCode.PERMISSION_DENIED
    other_runtime = beat("hb-evil", str(uuid.uuid4()), "127.0.0.1:1")
    other_runtime.runtime = "bash"
    assert await refused(gateway, evil, other_runtime) == grpc.StatusCode.PERMISSION_DENIED
    assert gateway.routes.route(echo.uid) == real  # type: ignore[attr-defined]
    answer = await invoke(client, gateway, echo.uid, {"still": "mine"})  # type: ignore[attr-defined]
    assert answer.status == 200 and answer.json["outputs"] == {"still": "mine"}


async def test_a_compromised_host_cannot_claim_a_run_it_was_not_given(
    gateway: Gateway,
    client: aiohttp.ClientSession,
    main_host: HostProcess,
    echo: object,
    pki: TestPKI,
    other_ca: TestPKI,
) -> None:
    """The attack: a beat claiming an existing Run at a higher attempt, from another host uid, with
    a huge interval, pointing the gateway at the attacker. The attacker holds a valid host
    certificate of its own, but not the control plane's key."""
    uid = echo.uid  # type: ignore[attr-defined]
    real = gateway.routes.route(uid)
    assert real is not None
    evil_uid = str(uuid.uuid4())
    claims = [
        # unsigned
        pb.RegistrationState(
            run_uid=uid,
            attempt=real.attempt + 1,
            namespace="default",
            name="fn",
            runtime="python",
            registration_id="reg-evil",
            phase=pb.REGISTRATION_PHASE_READY,
        ),
        # signed by another key
        registration(other_ca, uid, host_id="hb-evil", host_uid=evil_uid, attempt=real.attempt + 1),
        # a genuine assignment of the Run — to the real host, not to the attacker
        registration(
            pki, uid, host_id=main_host.host_id, host_uid=main_host.host_uid, attempt=real.attempt + 1
        ),
    ]
    tampered = registration(pki, str(uuid.uuid4()), host_id="hb-evil", host_uid=evil_uid)
    tampered.run_uid = uid  # a valid assignment of another Run, relabelled
    claims.append(tampered)
    for claim in claims:
        assert (
            await send(gateway, host(pki, "hb-evil"), beat("hb-evil", evil_uid, "127.0.0.1:1", claim))
        ).last_sequence == 1
        assert gateway.routes.route(uid) == real
    gateway.routes.forget(evil_uid)
    answer = await invoke(client, gateway, uid, {"to": "the owner"})
    assert answer.status == 200 and answer.json["outputs"] == {"to": "the owner"}


async def test_the_highest_signed_attempt_wins_and_a_replayed_lower_one_does_not(
    gateway: Gateway, pki: TestPKI
) -> None:
    uid = str(uuid.uuid4())
    old_uid, new_uid = str(uuid.uuid4()), str(uuid.uuid4())
    # attempt 2 on host hb-new, then the old host replays its (genuine) attempt 1
    await send(
        gateway, host(pki, "hb-new"), own(pki, "hb-new", new_uid, uid, attempt=2, address="127.0.0.1:2")
    )
    await send(gateway, host(pki, "hb-old"), own(pki, "hb-old", old_uid, uid, attempt=1))
    try:
        route = gateway.routes.route(uid)
        assert route is not None and (route.attempt, route.host_uid) == (2, new_uid)
    finally:
        gateway.routes.forget(old_uid)
        gateway.routes.forget(new_uid)


async def test_a_beat_cannot_keep_its_routes_alive_for_long(gateway: Gateway, pki: TestPKI) -> None:
    from kruntimes.gateway.routes import MAX_INTERVAL_MS, MISSED_INTERVALS

    uid, host_uid = str(uuid.uuid4()), str(uuid.uuid4())
    await send(gateway, host(pki, "hb-long"), own(pki, "hb-long", host_uid, uid))
    try:
        entry = gateway.routes._hosts[host_uid]  # (no public view of one host's expiry)
        assert entry.expires - time.monotonic() <= MISSED_INTERVALS * MAX_INTERVAL_MS / 1000
    finally:
        gateway.routes.forget(host_uid)


async def test_a_host_of_an_earlier_attempt_never_gets_the_run_back(
    gateway: Gateway, pki: TestPKI, client: aiohttp.ClientSession
) -> None:
    """The attack: the host of attempt 1 keeps beating its genuine (signed) assignment after the Run
    moved to attempt 2, waiting for the new host to be gone (crashed, drained, cut off)."""
    uid = str(uuid.uuid4())
    old_uid, new_uid = str(uuid.uuid4()), str(uuid.uuid4())
    old = own(pki, "hb-was", old_uid, uid)
    new = own(pki, "hb-now", new_uid, uid, attempt=2, address="127.0.0.1:2")
    try:
        await send(gateway, host(pki, "hb-was"), old)
        first = gateway.routes.route(uid)
        assert first is not None and first.host_uid == old_uid
        await send(gateway, host(pki, "hb-now"), new)
        moved = gateway.routes.route(uid)
        assert moved is not None and (moved.attempt, moved.host_uid) == (2, new_uid)
        gateway.routes.forget(new_uid)  # what a silent host comes to (the sweep, the route lookup)
        await send(gateway, host(pki, "hb-was"), old)  # accepted: it is the old host's own beat
        assert old_uid in gateway.routes._hosts  # (no public view of one host's entry)
        assert gateway.routes.route(uid) is None
        answer = await invoke(client, gateway, uid, {"to": "attempt 1"})
        assert answer.status in (404, 503), answer.body
        # a later attempt is routed as before
        await send(gateway, host(pki, "hb-now"), new)
        again = gateway.routes.route(uid)
        assert again is not None and again.host_uid == new_uid
    finally:
        gateway.routes.forget(old_uid)
        gateway.routes.forget(new_uid)


@pytest.mark.parametrize("field", ["namespace", "name", "runtime"])
async def test_a_signed_assignment_cannot_be_relabelled_into_another_namespace(
    gateway: Gateway, pki: TestPKI, client: aiohttp.ClientSession, field: str
) -> None:
    """The attack: a host holding a genuine assignment of a Run in namespace `default` announces
    it under namespace `other` (or another name or runtime), so that callers of `other` reach it."""
    uid, host_uid = str(uuid.uuid4()), str(uuid.uuid4())
    relabelled = registration(pki, uid, host_id="hb-label", host_uid=host_uid)
    setattr(relabelled, field, {"namespace": "other", "name": "evil", "runtime": "bash"}[field])
    genuine = registration(pki, uid, host_id="hb-label", host_uid=host_uid)
    try:
        await send(gateway, host(pki, "hb-label"), beat("hb-label", host_uid, "127.0.0.1:1", relabelled))
        assert gateway.routes.route(uid) is None
        answer = await invoke(client, gateway, uid, {}, token=BOB, namespace="other")
        assert answer.status == 404, answer.body
        # the same assignment as signed is routed: the refusal was the relabelling's
        await send(gateway, host(pki, "hb-label"), beat("hb-label", host_uid, "127.0.0.1:1", genuine))
        route = gateway.routes.route(uid)
        assert route is not None and (route.namespace, route.name, route.runtime) == (
            "default",
            "fn",
            "python",
        )
    finally:
        gateway.routes.forget(host_uid)
