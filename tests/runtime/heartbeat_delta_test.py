"""A host's heartbeat stream says what changed, and a gateway applying it ends with the routes a
whole snapshot gives: each message after the first carries only the registrations added or
changed (an unchanged one is the host's same message) and the run uids removed; every
WHOLE_EVERY_S one is whole again."""

from __future__ import annotations

import random
import uuid

from kruntimes.gateway.routes import Route, RouteCache
from kruntimes.pki import Identity, PeerTLS, Role
from kruntimes.pki.assignments import Verifier
from kruntimes.rpc.v1 import heartbeat_pb2 as hb
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.runtime.heartbeat import HeartbeatSender
from tests.support.beats import registration
from tests.support.pki import TestPKI

HOST_UID = "uid-delta-0"
PEER = Identity.host(runtime="python", host_id="h-0")


async def test_the_stream_carries_what_changed_and_the_gateway_ends_with_the_hosts_routes(
    pki: TestPKI,
) -> None:
    held: dict[str, pb.RegistrationState] = {}
    sender = HeartbeatSender(
        gateways=[],
        host_id="h-0",
        host_uid=HOST_UID,
        runtime="python",
        address="127.0.0.1:1",
        interval_s=60.0,
        tls=PeerTLS(pki.host_dir("h-0"), role=Role.HOST),
        snapshot=lambda: list(held.values()),
    )
    routes = RouteCache(verifier=Verifier([pki.signer.public_key]))
    stream, messages = object(), sender._messages()
    rng = random.Random(7)

    async def next_beat() -> hb.HostHeartbeat:
        sender.changed()  # no wait for the interval
        beat = next(messages)
        await routes.apply(beat, peer=PEER, stream=stream, continues=beat.sequence > 1)
        return beat

    for _ in range(5):
        uid = str(uuid.uuid4())
        held[uid] = registration(pki, uid, host_uid=HOST_UID)
    first = await next_beat()
    assert not first.delta and len(first.registrations) == 5
    idle = await next_beat()
    assert idle.delta and not idle.registrations and not idle.removed, "nothing changed: nothing sent"
    for _ in range(40):
        action = rng.choice(["add", "remove", "move"]) if held else "add"
        if action == "add":
            uid = str(uuid.uuid4())
            held[uid] = registration(pki, uid, host_uid=HOST_UID)
            expected = ([uid], [])
        elif action == "remove":
            uid = rng.choice(sorted(held))
            del held[uid]
            expected = ([], [uid])
        else:
            uid = rng.choice(sorted(held))
            held[uid] = registration(pki, uid, host_uid=HOST_UID, attempt=held[uid].attempt + 1)
            expected = ([uid], [])
        beat = await next_beat()
        assert beat.delta
        assert ([r.run_uid for r in beat.registrations], list(beat.removed)) == expected
        assert {u: (r.attempt if (r := routes.route(u)) else None) for u in held} == {
            u: reg.attempt for u, reg in held.items()
        }
        assert len(routes) == len(held)
    sender.whole_every_s = 0.0  # as if the last whole one were that old
    whole = await next_beat()
    assert not whole.delta and len(whole.registrations) == len(held)
    assert len(routes) == len(held)
    # one copy of a Run's uid a route (10,000 routes: ~0.85 MB each copy), not the beats' as well
    index = [(k, r) for k, r in routes._routes.items() if isinstance(r, Route)]
    assert len(index) == len(held) and all(key is route.run_uid for key, route in index)
    assert all(key is route.run_uid for key, route in routes._hosts[HOST_UID].routes.items())
