"""The test suite's platform PKI: one CA and assignment key per session, certificates for any
identity, signed assignments, and gRPC channels that present a role's certificate — so tests talk
to real hosts and gateways over the same mutual TLS as the platform."""

from __future__ import annotations

import datetime as dt
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from cryptography import x509

from kruntimes.pki import (
    ASSIGNMENT_PUBLIC_KEY,
    CA_CERT,
    DEFAULT_LIFETIME,
    Authority,
    HostIssuer,
    Identity,
    PeerTLS,
    Role,
)
from kruntimes.pki.assignments import SignedAssignment, Signer, Verifier
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.workers.settings import WorkerTrust

CONTROL_PLANE = Identity.control_plane("test-worker")
GATEWAY = Identity.gateway("test-gateway")


@dataclass
class TestPKI:
    root: Path
    authority: Authority
    signer: Signer
    _peers: dict[Identity, PeerTLS] = field(default_factory=dict)

    __test__ = False  # not a test class

    @classmethod
    def create(cls, root: Path) -> TestPKI:
        authority = Authority.ensure(root / "ca")
        signer = Signer.ensure(root / "assignments.key")
        return cls(root, authority, signer)

    @property
    def assignment_key(self) -> Path:
        return self.root / "assignments.key"

    @property
    def public_key(self) -> Path:
        return self.root / "assignments.pub"

    def verifier(self) -> Verifier:
        return Verifier.load(self.public_key)

    def issuer(self, *, lifetime: dt.timedelta = DEFAULT_LIFETIME) -> HostIssuer:
        return HostIssuer(self.authority, self.signer.public_pem, lifetime)

    def directory(self, identity: Identity, *, lifetime: dt.timedelta = DEFAULT_LIFETIME) -> Path:
        """A certificate directory for `identity` (hosts: with the assignment public key); issued once."""
        path = self.root / "certs" / identity.role / identity.name.replace("/", "_")
        if not path.exists():
            if identity.role is Role.HOST:
                self.issuer(lifetime=lifetime).issue(path, runtime=identity.runtime, host_id=identity.host_id)
            else:
                self.authority.write(path, identity, lifetime=lifetime, ip_addresses=("127.0.0.1",))
        return path

    def host_dir(self, host_id: str, runtime: str = "python") -> Path:
        return self.directory(Identity.host(runtime=runtime, host_id=host_id))

    def host_args(self, host_id: str, runtime: str = "python") -> list[str]:
        """The `krt host` flags of host `runtime/host_id`."""
        directory = self.host_dir(host_id, runtime)
        return [
            "--peer-tls",
            str(directory),
            "--assignment-public-key",
            str(directory / ASSIGNMENT_PUBLIC_KEY),
        ]

    def peer(self, identity: Identity) -> PeerTLS:
        found = self._peers.get(identity)
        if found is None:
            found = self._peers[identity] = PeerTLS(self.directory(identity), role=identity.role)
        return found

    def host_tls(self, host_id: str, runtime: str = "python") -> PeerTLS:
        return self.peer(Identity.host(runtime=runtime, host_id=host_id))

    @property
    def control_plane(self) -> PeerTLS:
        return self.peer(CONTROL_PLANE)

    @property
    def gateway(self) -> PeerTLS:
        return self.peer(GATEWAY)

    def impostor(self, other: TestPKI, identity: Identity) -> PeerTLS:
        """A client presenting `other`'s (another CA's) certificate for `identity` while trusting
        this CA, so only the server's check of the client certificate can refuse it."""
        path = self.root / "impostors" / other.root.name / identity.role / identity.name.replace("/", "_")
        if not path.exists():
            shutil.copytree(other.directory(identity), path)
            (path / CA_CERT).write_bytes(self.authority.cert_pem)
        return PeerTLS(path, role=identity.role)

    def expired(self, identity: Identity) -> PeerTLS:
        """A certificate of this CA for `identity` whose validity ended an hour ago."""
        path = self.root / "expired" / identity.role / identity.name.replace("/", "_")
        if not path.exists():
            then = dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)
            self.authority.write(path, identity, lifetime=dt.timedelta(hours=1), now=then)
        return PeerTLS(path, role=identity.role)

    def not_yet_valid(self, identity: Identity) -> PeerTLS:
        """A certificate of this CA for `identity` whose validity starts in an hour."""
        path = self.root / "not-yet-valid" / identity.role / identity.name.replace("/", "_")
        if not path.exists():
            then = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
            self.authority.write(path, identity, lifetime=dt.timedelta(hours=1), now=then)
        return PeerTLS(path, role=identity.role)

    def worker_trust(self) -> WorkerTrust:
        return WorkerTrust(
            peer_tls=self.directory(CONTROL_PLANE),
            assignment_key=self.assignment_key,
            platform_ca=self.root / "ca",
        )

    def sign(
        self,
        *,
        run_uid: str,
        attempt: int,
        host_id: str,
        host_uid: str,
        namespace: str = "default",
        name: str = "fn",
        runtime: str = "python",
    ) -> pb.SignedAssignment:
        return self.signer.sign(
            SignedAssignment(
                run_uid=run_uid,
                attempt=attempt,
                host_id=host_id,
                host_uid=host_uid,
                namespace=namespace,
                name=name,
                runtime=runtime,
            )
        )

    def channel(self, address: str, *, as_: PeerTLS, host: Identity | Role = Role.HOST) -> grpc.Channel:
        """A blocking gRPC channel to a host (or a gateway, `host=Role.GATEWAY`) presenting `as_`."""
        return grpc.secure_channel(address, as_.channel_credentials(), options=as_.channel_options(host))

    def aio_channel(
        self, address: str, *, as_: PeerTLS, host: Identity | Role = Role.HOST
    ) -> grpc.aio.Channel:
        return grpc.aio.secure_channel(address, as_.channel_credentials(), options=as_.channel_options(host))


def presented_serial(address: str, tls: PeerTLS, expect: Identity) -> int:
    """The serial of the certificate the host `expect` presents to a new connection on its invoke
    port at `address` (read after its accept frame), connecting with `tls`."""
    host, _, port = address.rpartition(":")
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        tls.client_context().wrap_socket(raw, server_hostname=expect.dns_name) as sock,
    ):
        assert sock.recv(9)  # accepted
        der = sock.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number
