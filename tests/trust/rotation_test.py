"""Certificates rotate under a steady invoke load with no failed invoke: every certificate of the
hop lives seconds, is renewed at two thirds of its life by the platform's own renewal code, and the
invokes keep going past the moment every original certificate expired — over connections made
before and after each renewal (the gateway reconnects to the host every few invokes)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import ssl
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kruntimes.gateway.server import Gateway
from kruntimes.pki import TLS_CERT, Identity, PeerTLS, Role
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from tests.support.pki import TestPKI, presented_serial
from tests.support.waiting import eventually
from tests.trust.hop import echo_registration, host_process, token_gateway

LIFETIME = dt.timedelta(seconds=6)
TOKEN = f"tok-rotation-{uuid.uuid4().hex}"
HOST = Identity.host(runtime="python", host_id="rot-0")
GATEWAY = Identity.gateway("rot-gw")
CONTROL = Identity.control_plane("rot-worker")
RECONNECT_EVERY = 20  # invokes between two reconnections of the gateway to the host
BOUND_S = 60.0


def not_after(directory: Path) -> dt.datetime:
    return x509.load_pem_x509_certificate((directory / TLS_CERT).read_bytes()).not_valid_after_utc


def serial(directory: Path) -> int:
    return x509.load_pem_x509_certificate((directory / TLS_CERT).read_bytes()).serial_number


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[tuple[TestPKI, Gateway, dict[str, Path], dict[str, str]]]:
    ca = TestPKI.create(tmp_path / "pki")
    dirs = {"host": tmp_path / "host", "gateway": tmp_path / "gateway", "control": tmp_path / "control"}
    ca.issuer(lifetime=LIFETIME).issue(dirs["host"], runtime="python", host_id="rot-0")
    ca.authority.write(dirs["gateway"], GATEWAY, lifetime=LIFETIME, ip_addresses=("127.0.0.1",))
    ca.authority.write(dirs["control"], CONTROL, lifetime=LIFETIME)
    gateway = token_gateway(
        tmp_path,
        TOKEN,
        peer_tls=PeerTLS(dirs["gateway"], role=Role.GATEWAY, check_interval_s=0.1),
        assignments=ca.verifier(),
    )
    await gateway.start()
    try:
        async with host_process(tmp_path, "rot-0", tls=dirs["host"], gateway=gateway) as info:
            yield ca, gateway, dirs, info
    finally:
        await gateway.stop()


async def renew(ca: TestPKI, dirs: dict[str, Path], stop: asyncio.Event) -> int:
    """The renewal the platform runs (re-issue what is due), at a short interval; returns how many."""
    renewed = 0
    while not stop.is_set():
        for directory in dirs.values():
            renewed += ca.authority.renew_if_due(directory) is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)
    return renewed


async def test_certificates_rotate_under_a_steady_invoke_load_with_no_failed_invoke(
    stack: tuple[TestPKI, Gateway, dict[str, Path], dict[str, str]],
) -> None:
    ca, gateway, dirs, info = stack
    control = PeerTLS(dirs["control"], role=Role.CONTROL_PLANE, check_interval_s=0.1)
    uid = str(uuid.uuid4())
    async with ca.aio_channel(info["address"], as_=control) as channel:
        await pb_grpc.FunctionRuntimeStub(channel).RegisterFunction(
            echo_registration(
                pb.RunRef(run_uid=uid, attempt=1, namespace="default", name="fn", runtime="python"),
                ca.sign(run_uid=uid, attempt=1, host_id="rot-0", host_uid=info["hostUid"]),
            ),
            timeout=30,
        )
    route = await eventually(lambda: gateway.routes.route(uid), every=0.05, what="the gateway's route")
    assert route.invoke_address
    originals = {name: (serial(d), not_after(d)) for name, d in dirs.items()}
    last_expiry = max(expiry for _, expiry in originals.values())

    stop = asyncio.Event()
    renewer = asyncio.create_task(renew(ca, dirs, stop))
    url = f"{gateway.url}/v1/namespaces/default/runtimes/python/functions/{uid}:invoke"
    context = ssl.create_default_context(cafile=str(gateway.options.cert_file.parent / "ca.crt"))
    failures: list[str] = []
    invokes = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BOUND_S
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        # until every original certificate expired, and a while beyond (bounded)
        while dt.datetime.now(dt.UTC) < last_expiry + dt.timedelta(seconds=1) and loop.time() < deadline:
            if invokes % RECONNECT_EVERY == 0:
                gateway.upstreams.raw.close()  # between invokes: the next one connects anew
            async with session.post(
                url, json={"n": invokes}, headers={"Authorization": f"Bearer {TOKEN}"}
            ) as r:
                body = await r.read()
                if r.status != 200 or json.loads(body)["outputs"] != {"n": invokes}:
                    failures.append(f"{r.status}: {body[:200]!r}")
            invokes += 1
    stop.set()
    renewed = await renewer

    assert not failures, f"{len(failures)} of {invokes} invokes failed, e.g. {failures[:3]}"
    assert dt.datetime.now(dt.UTC) > last_expiry, "the load outlived every original certificate"
    assert invokes > 50
    assert renewed >= len(dirs), "each certificate was renewed"
    for name, directory in dirs.items():
        assert serial(directory) != originals[name][0], name
    # new connections now meet the renewed certificates on every port
    gateway_tls = gateway.options.peer_tls
    assert gateway_tls is not None
    current = serial(dirs["host"])
    await eventually(  # the host looks at its files once a second
        lambda: presented_serial(route.invoke_address, gateway_tls, HOST),
        until=lambda presented: presented == current,
        every=0.05,
        what="the host's invoke port to present its renewed certificate",
    )
    async with ca.aio_channel(info["address"], as_=control) as channel:
        answer = await pb_grpc.FunctionRuntimeStub(channel).HostInfo(pb.HostInfoRequest(), timeout=10)
        assert [r.run_uid for r in answer.registrations] == [uid]
    host_tls = PeerTLS(dirs["host"], role=Role.HOST)
    async with ca.aio_channel(gateway.heartbeat_address, as_=host_tls, host=Role.GATEWAY) as channel:
        check = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert check.status == health_pb2.HealthCheckResponse.SERVING
