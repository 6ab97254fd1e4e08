"""The benches' platform PKI: a CA and an assignment key in a temporary directory, certificate
directories for the identities a bench runs, and gRPC channels presenting one of them — so the
benches measure the platform with the mutual TLS it always has."""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
from _benchlib import register_request

from kruntimes.pki import ASSIGNMENT_PUBLIC_KEY, Authority, HostIssuer, Identity, PeerTLS, Role
from kruntimes.pki.assignments import SignedAssignment, Signer
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.workers.settings import WorkerTrust

CONTROL_PLANE = Identity.control_plane("bench-worker")
GATEWAY = Identity.gateway("bench-gateway")


class BenchPKI:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.authority = Authority.ensure(root / "ca")
        self.signer = Signer.ensure(root / "assignments.key")
        self.public_key = root / "assignments.pub"

    def directory(self, identity: Identity) -> Path:
        path = self.root / identity.role / identity.name.replace("/", "_")
        if not path.exists():
            if identity.role is Role.HOST:
                HostIssuer(self.authority, self.signer.public_pem).issue(
                    path, runtime=identity.runtime, host_id=identity.host_id
                )
            else:
                self.authority.write(path, identity, ip_addresses=("127.0.0.1",))
        return path

    def host_args(self, host_id: str, runtime: str = "python") -> list[str]:
        directory = self.directory(Identity.host(runtime=runtime, host_id=host_id))
        return [
            "--peer-tls",
            str(directory),
            "--assignment-public-key",
            str(directory / ASSIGNMENT_PUBLIC_KEY),
        ]

    def gateway_args(self) -> list[str]:
        return ["--peer-tls", str(self.directory(GATEWAY)), "--assignment-public-key", str(self.public_key)]

    def worker_trust(self) -> WorkerTrust:
        return WorkerTrust(
            peer_tls=self.directory(CONTROL_PLANE),
            assignment_key=self.root / "assignments.key",
            platform_ca=self.root / "ca",
        )

    def aio_channel(self, address: str, *, as_: Identity) -> grpc.aio.Channel:
        """A channel to a host presenting `as_`'s certificate."""
        tls = PeerTLS(self.directory(as_), role=as_.role)
        return grpc.aio.secure_channel(
            address, tls.channel_credentials(), options=tls.channel_options(Role.HOST)
        )

    def register_request(
        self, index: int, *, host_id: str, host_uid: str, namespace: str
    ) -> pb.RegisterFunctionRequest:
        """Function `fn-<index>` (bench/_benchlib.register_request) for a new Run, with the control
        plane's signed assignment of it to the host."""
        run_uid = str(uuid.uuid4())
        signed = self.sign(
            run_uid=run_uid, host_id=host_id, host_uid=host_uid, name=f"fn-{index}", namespace=namespace
        )
        return register_request(index, namespace=namespace, run_uid=run_uid, assignment=signed)

    def sign(
        self, *, run_uid: str, host_id: str, host_uid: str, name: str, namespace: str
    ) -> pb.SignedAssignment:
        return self.signer.sign(
            SignedAssignment(
                run_uid=run_uid,
                attempt=1,
                host_id=host_id,
                host_uid=host_uid,
                namespace=namespace,
                name=name,
                runtime="python",
            )
        )
