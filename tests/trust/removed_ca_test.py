"""A CA taken out of a host's `ca.crt` (the last phase of a CA rotation, or an operator dropping a
compromised CA) is refused at once on every port of the running host, without a restart: the
attack is a client certificate the dropped CA signed — a gateway's on the invoke port, the control
plane's on the gRPC port — after the host's bundle no longer holds that CA. The host is a real
Runtime Server on 127.0.0.1, the clients real ssl and gRPC clients."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kruntimes.pki import CA_CERT, Identity, PeerTLS, Role
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.runtime.server import HostOptions, RuntimeHost
from tests.support.invoke_port import accepted
from tests.support.pki import CONTROL_PLANE, GATEWAY, TestPKI
from tests.support.waiting import wait_until

HOST = Identity.host(runtime="python", host_id="dropped-0")
RELOAD_S = 30.0  # a hang guard on the host taking up its changed files (it looks once a second)


def _host_info(pki: TestPKI, address: str, as_: PeerTLS) -> bool:
    """Whether the host answers HostInfo to a client presenting `as_`."""
    with pki.channel(address, as_=as_) as channel:
        try:
            pb_grpc.FunctionRuntimeStub(channel).HostInfo(pb.HostInfoRequest(), timeout=10)
        except grpc.RpcError:
            return False
    return True


@pytest.fixture
def dropped(pki: TestPKI, tmp_path: Path) -> Iterator[tuple[RuntimeHost, Path, TestPKI]]:
    """A host trusting the suite's CA and a second one (`ca.crt` holds both); the second CA and
    the host's certificate directory are returned with it."""
    second = TestPKI.create(tmp_path / "second-ca")
    directory = tmp_path / "host-tls"
    shutil.copytree(pki.directory(HOST), directory)
    (directory / CA_CERT).write_bytes(pki.authority.cert_pem + second.authority.cert_pem)
    host = RuntimeHost(
        HostOptions(
            host_id=HOST.host_id,
            runtime=HOST.runtime,
            listen="127.0.0.1:0",
            state_dir=tmp_path / "state",
            tls=PeerTLS(directory, role=Role.HOST),
            assignments=pki.verifier(),
        )
    )
    host.start()
    try:
        yield host, directory, second
    finally:
        host.stop(grace_s=1)


def test_a_ca_dropped_from_the_bundle_is_refused_at_once_on_the_invoke_port(
    pki: TestPKI, dropped: tuple[RuntimeHost, Path, TestPKI]
) -> None:
    host, directory, second = dropped
    theirs = pki.impostor(second, GATEWAY).client_context()  # the second CA's gateway
    ours = pki.gateway.client_context()
    assert accepted(host.invoke_address, theirs, server_hostname=HOST.dns_name)
    (directory / CA_CERT).write_bytes(pki.authority.cert_pem)  # the second CA dropped
    assert wait_until(
        lambda: not accepted(host.invoke_address, theirs, server_hostname=HOST.dns_name), within=RELOAD_S
    ), "the invoke port still takes a gateway of the dropped CA"
    assert accepted(host.invoke_address, ours, server_hostname=HOST.dns_name)


def test_a_ca_dropped_from_the_bundle_is_refused_at_once_on_the_grpc_port(
    pki: TestPKI, dropped: tuple[RuntimeHost, Path, TestPKI]
) -> None:
    host, directory, second = dropped
    theirs = pki.impostor(second, CONTROL_PLANE)
    assert _host_info(pki, host.address, theirs)
    (directory / CA_CERT).write_bytes(pki.authority.cert_pem)
    assert wait_until(lambda: not _host_info(pki, host.address, theirs), within=RELOAD_S), (
        "the gRPC port still takes a control plane of the dropped CA"
    )
    assert _host_info(pki, host.address, pki.control_plane)
