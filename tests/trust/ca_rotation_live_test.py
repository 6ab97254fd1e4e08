"""A rotation of the platform CA with the platform running, end to end: the embedded platform's own
PKI code (ensure_pki, renew_platform_certificates) drives both phases, the rotation's clock
injected at each step; the worker's host issuer (reading the CA directory through AuthorityWatch)
renews the hosts; a real gateway and real runtime host processes speak mutual TLS throughout.

At every step an existing host still accepts the worker's and the gateway's current certificates
on new connections, the gateway accepts the host's, and a Run on the host still answers over the
gateway; a host issued after the switch is trusted; the old CA finally leaves every bundle."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import ssl
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kruntimes.gateway.server import Gateway
from kruntimes.pki import (
    CA_CERT,
    TLS_CERT,
    AuthorityWatch,
    HostIssuer,
    Identity,
    PeerTLS,
    Role,
)
from kruntimes.pki import rotation as ca_rotation
from kruntimes.pki.assignments import SignedAssignment, Signer, Verifier
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.workers.embedded.layout import Layout, ensure_pki
from kruntimes.workers.embedded.supervise import renew_platform_certificates
from tests.support.pki import presented_serial
from tests.support.waiting import eventually
from tests.trust.hop import echo_registration, host_process, token_gateway

LIFETIME = dt.timedelta(hours=1)  # every certificate's; the phases are reached by the clock given
TOKEN = f"tok-ca-rotation-{uuid.uuid4().hex}"
BOUND_S = 30.0


def leaf(directory: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate((directory / TLS_CERT).read_bytes())


def bundle(directory: Path) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates((directory / CA_CERT).read_bytes())


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait (bounded) for `condition`, looking every 50 ms."""
    await eventually(condition, within=BOUND_S, every=0.05, what=what)


@dataclass
class Host:
    host_id: str
    directory: Path
    address: str
    host_uid: str
    run_uid: str = ""


@dataclass
class Platform:
    layout: Layout
    gateway: Gateway
    gateway_tls: PeerTLS
    control: PeerTLS
    issuer: HostIssuer
    signer: Signer
    root: Path

    @contextlib.asynccontextmanager
    async def host(self, host_id: str) -> AsyncIterator[Host]:
        """A runtime host process with a certificate the worker's issuer gives it now, serving a
        registered echo function."""
        directory = self.root / f"{host_id}.tls"
        self.issuer.issue(directory, runtime="python", host_id=host_id)
        async with host_process(self.root, host_id, tls=directory, gateway=self.gateway) as info:
            host = Host(host_id, directory, info["address"], info["hostUid"])
            await self.register(host)
            yield host

    def host_channel(self, host: Host) -> grpc.aio.Channel:
        """A new channel to the host as the worker makes one: its control-plane certificate."""
        return grpc.aio.secure_channel(
            host.address,
            self.control.channel_credentials(),
            options=self.control.channel_options(Identity.host(runtime="python", host_id=host.host_id)),
        )

    async def register(self, host: Host) -> None:
        host.run_uid = str(uuid.uuid4())
        assignment = SignedAssignment(
            run_uid=host.run_uid,
            attempt=1,
            host_id=host.host_id,
            host_uid=host.host_uid,
            namespace="default",
            name="fn",
            runtime="python",
        )
        async with self.host_channel(host) as channel:
            await pb_grpc.FunctionRuntimeStub(channel).RegisterFunction(
                echo_registration(
                    pb.RunRef(
                        run_uid=host.run_uid, attempt=1, namespace="default", name="fn", runtime="python"
                    ),
                    self.signer.sign(assignment),
                ),
                timeout=30,
            )
        await until(lambda: self.gateway.routes.route(host.run_uid) is not None, "the route")

    async def current(self, *hosts: Host) -> None:
        """Wait until the gateway, the worker and each host use their certificate files as they are
        now (each looks at its files on its own interval)."""
        for tls, directory in (
            (self.gateway_tls, self.layout.gateway_tls),
            (self.control, self.layout.worker_tls),
        ):

            def reloaded(tls: PeerTLS = tls, directory: Path = directory) -> bool:
                tls.refresh()
                return tls.serial == leaf(directory).serial_number

            await until(reloaded, f"{directory} taken up")
        for host in hosts:
            route = self.gateway.routes.route(host.run_uid)
            assert route is not None and route.invoke_address

            def presents(host: Host = host, address: str = route.invoke_address) -> bool:
                expect = Identity.host(runtime="python", host_id=host.host_id)
                return (
                    presented_serial(address, self.gateway_tls, expect) == leaf(host.directory).serial_number
                )

            await until(presents, f"{host.host_id} presents its current certificate")

    async def check(self, host: Host) -> None:
        """New connections every way between the worker, the gateway and `host`, and an invoke of
        the host's Run over the gateway."""
        async with self.host_channel(host) as channel:
            info = await pb_grpc.FunctionRuntimeStub(channel).HostInfo(pb.HostInfoRequest(), timeout=10)
        assert host.run_uid in [r.run_uid for r in info.registrations]
        host_tls = PeerTLS(host.directory, role=Role.HOST)
        async with grpc.aio.secure_channel(
            self.gateway.heartbeat_address,
            host_tls.channel_credentials(),
            options=host_tls.channel_options(Role.GATEWAY),
        ) as channel:
            answer = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        self.gateway.upstreams.raw.close()  # the invoke connects anew, with the current certificates
        url = f"{self.gateway.url}/v1/namespaces/default/runtimes/python/functions/{host.run_uid}:invoke"
        context = ssl.create_default_context(cafile=str(self.gateway.options.cert_file.parent / "ca.crt"))
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session,
            session.post(url, json={"to": host.host_id}, headers={"Authorization": f"Bearer {TOKEN}"}) as r,
        ):
            body = await r.read()
        assert r.status == 200, body[:300]
        assert json.loads(body)["outputs"] == {"to": host.host_id}


@pytest.fixture
async def platform(tmp_path: Path) -> AsyncIterator[Platform]:
    layout = Layout(tmp_path / "state")
    layout.root.mkdir()
    ensure_pki(layout, lifetime=LIFETIME)
    signer = Signer.load(layout.assignment_key)
    gateway_tls = PeerTLS(layout.gateway_tls, role=Role.GATEWAY, check_interval_s=0.1)
    gateway = token_gateway(
        tmp_path, TOKEN, peer_tls=gateway_tls, assignments=Verifier.load(layout.assignment_public_key)
    )
    await gateway.start()
    try:
        yield Platform(
            layout=layout,
            gateway=gateway,
            gateway_tls=gateway_tls,
            control=PeerTLS(layout.worker_tls, role=Role.CONTROL_PLANE, check_interval_s=0.1),
            issuer=HostIssuer(AuthorityWatch(layout.pki), signer.public_pem, LIFETIME),
            signer=signer,
            root=tmp_path,
        )
    finally:
        await gateway.stop()


def platform_files(p: Platform, *hosts: Host) -> dict[Path, bytes]:
    paths = [p.layout.pki / n for n in (ca_rotation.STATE, "ca.crt", "ca.key", "bundle.crt")]
    for directory in (p.layout.gateway_tls, p.layout.worker_tls, *(h.directory for h in hosts)):
        paths += [directory / n for n in (TLS_CERT, CA_CERT)]
    return {path: path.read_bytes() for path in paths}


async def test_a_ca_rotation_keeps_every_running_host_connected_through_both_phases(
    platform: Platform,
) -> None:
    p = platform
    old_ca = bundle(p.layout.gateway_tls)[0]
    async with p.host("rot-a") as first:
        await p.check(first)

        # phase 1: the next CA in every bundle; the old one still signs
        _, steps = ensure_pki(p.layout, lifetime=LIFETIME, start_rotation=True)
        assert steps == [ca_rotation.Step.PUBLISHED]
        published = ca_rotation.load(p.layout.pki)
        assert published is not None and published.next is not None
        new_ca = published.next.cert
        for directory in (p.layout.gateway_tls, p.layout.worker_tls):
            assert bundle(directory) == [old_ca, new_ca], directory
            leaf(directory).verify_directly_issued_by(old_ca)
        await p.current()
        assert bundle(first.directory) == [old_ca]  # the host has not been renewed yet
        await p.check(first)
        assert p.issuer.renew_due([first.directory]) == 1, "its ca.crt is not the bundle"
        assert bundle(first.directory) == [old_ca, new_ca]
        await p.current(first)
        await p.check(first)
        # the same checks again take no step and renew nothing
        kept = platform_files(p, first)
        assert renew_platform_certificates(p.layout, lifetime=LIFETIME) == 0
        assert p.issuer.renew_due([first.directory]) == 0
        assert platform_files(p, first) == kept

        # phase 2, once the overlap has passed: the next CA signs
        assert published.switch_after is not None
        assert renew_platform_certificates(p.layout, now=published.switch_after, lifetime=LIFETIME) == 2
        switched = ca_rotation.load(p.layout.pki)
        assert switched is not None and switched.phase == "switched"
        for directory in (p.layout.gateway_tls, p.layout.worker_tls):
            leaf(directory).verify_directly_issued_by(new_ca)
            assert bundle(directory) == [new_ca, old_ca]
        await p.current()
        leaf(first.directory).verify_directly_issued_by(old_ca)  # the host's is still the old CA's
        await p.check(first)
        async with p.host("rot-b") as second:  # issued after the switch: by the new CA
            leaf(second.directory).verify_directly_issued_by(new_ca)
            assert bundle(second.directory) == [new_ca, old_ca]
            await p.check(second)
            assert p.issuer.renew_due([first.directory, second.directory]) == 1  # the old CA's
            leaf(first.directory).verify_directly_issued_by(new_ca)
            await p.current(first, second)
            await p.check(first)

            # and once nothing the old CA signed can be valid, it leaves every bundle
            assert switched.retire_until is not None
            assert renew_platform_certificates(p.layout, now=switched.retire_until, lifetime=LIFETIME) == 2
            assert p.issuer.renew_due([first.directory, second.directory]) == 2
            await p.current(first, second)
            for directory in (p.layout.gateway_tls, p.layout.worker_tls, first.directory, second.directory):
                assert bundle(directory) == [new_ca], directory
            assert (p.layout.pki / "bundle.crt").read_bytes() == (p.layout.pki / "ca.crt").read_bytes()
            await p.check(first)
            await p.check(second)
