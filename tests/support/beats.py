"""Heartbeats as a host sends them, for tests that feed the gateway's route cache directly: a
registration with its assignment signed by the test PKI, and the host's snapshot holding them."""

from __future__ import annotations

from collections.abc import Iterable

from kruntimes.rpc.v1 import heartbeat_pb2 as hb
from kruntimes.rpc.v1 import runtime_pb2 as pb
from tests.support.pki import TestPKI


def registration(
    pki: TestPKI,
    uid: str,
    *,
    host_uid: str,
    host_id: str = "h-0",
    attempt: int = 1,
    name: str = "fn",
    registration_id: str | None = None,
    signer: TestPKI | None = None,
) -> pb.RegistrationState:
    """A Ready registration of Run `uid` (default/`name`, python) on the host, its assignment
    signed by `signer` (default: `pki`); its id is `reg-` and the uid's first 8 characters unless
    given."""
    return pb.RegistrationState(
        run_uid=uid,
        attempt=attempt,
        namespace="default",
        name=name,
        runtime="python",
        registration_id=registration_id if registration_id is not None else f"reg-{uid[:8]}",
        phase=pb.REGISTRATION_PHASE_READY,
        assignment=(signer or pki).sign(
            run_uid=uid, attempt=attempt, host_id=host_id, host_uid=host_uid, name=name
        ),
    )


def heartbeat(
    *,
    host_uid: str,
    address: str,
    registrations: Iterable[pb.RegistrationState],
    host_id: str = "h-0",
    invoke_address: str = "",
    sequence: int = 0,
    interval_ms: int = 1000,
) -> hb.HostHeartbeat:
    """A python host's snapshot: its gRPC (and invoke port) address and `registrations`."""
    return hb.HostHeartbeat(
        host_id=host_id,
        host_uid=host_uid,
        runtime="python",
        address=address,
        invoke_address=invoke_address,
        sequence=sequence,
        interval_ms=interval_ms,
        registrations=list(registrations),
    )
