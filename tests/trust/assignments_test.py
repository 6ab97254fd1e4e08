"""Signed assignments (kruntimes.pki.assignments): what the control plane signs, and that no change
to any field, byte or key gets past a verifier."""

from __future__ import annotations

import datetime as dt
import os
import stat
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID

from kruntimes.pki.assignments import AssignmentError, Signer, Verifier
from kruntimes.rpc.v1 import runtime_pb2 as pb
from tests.trust.assignment_data import ASSIGNMENT

FIELDS = ("run_uid", "attempt", "host_id", "host_uid", "namespace", "name", "runtime")


@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> Signer:
    return Signer.ensure(tmp_path_factory.mktemp("keys") / "assignments.key")


@pytest.fixture(scope="module")
def verifier(signer: Signer) -> Verifier:
    return Verifier([signer.public_key])


def test_the_key_is_kept_private_and_its_public_half_beside_it(tmp_path: Path) -> None:
    signer = Signer.ensure(tmp_path / "assignments.key")
    assert stat.S_IMODE(os.stat(tmp_path / "assignments.key").st_mode) == 0o600
    assert (tmp_path / "assignments.pub").read_bytes() == signer.public_pem
    assert Signer.ensure(tmp_path / "assignments.key").key_id == signer.key_id
    assert Verifier.load(tmp_path / "assignments.pub").verify(signer.sign(ASSIGNMENT)) == ASSIGNMENT
    assert b"PRIVATE" not in signer.public_pem


def test_a_signed_assignment_verifies_to_what_was_signed(signer: Signer, verifier: Verifier) -> None:
    signed = signer.sign(ASSIGNMENT)
    assert verifier.verify(signed) == ASSIGNMENT
    assert signer.sign(ASSIGNMENT) == signed, "deterministic: the same assignment, the same bytes"
    assert verifier.verify(pb.SignedAssignment.FromString(signed.SerializeToString())) == ASSIGNMENT


@pytest.mark.parametrize("field", FIELDS)
def test_changing_any_field_breaks_the_signature(signer: Signer, verifier: Verifier, field: str) -> None:
    signed = signer.sign(ASSIGNMENT)
    message = pb.Assignment.FromString(signed.assignment)
    value = getattr(message, field)
    setattr(message, field, value + 1 if isinstance(value, int) else value + "x")
    tampered = pb.SignedAssignment(
        assignment=message.SerializeToString(), signature=signed.signature, key_id=signed.key_id
    )
    with pytest.raises(AssignmentError, match="does not verify"):
        verifier.verify(tampered)


def test_changing_any_byte_of_the_assignment_or_signature_breaks_it(
    signer: Signer, verifier: Verifier
) -> None:
    signed = signer.sign(ASSIGNMENT)
    for i in range(len(signed.assignment)):
        data = bytearray(signed.assignment)
        data[i] ^= 0x01
        with pytest.raises(AssignmentError):
            verifier.verify(
                pb.SignedAssignment(assignment=bytes(data), signature=signed.signature, key_id=signed.key_id)
            )
    for i in range(len(signed.signature)):
        sig = bytearray(signed.signature)
        sig[i] ^= 0x80
        with pytest.raises(AssignmentError):
            verifier.verify(
                pb.SignedAssignment(assignment=signed.assignment, signature=bytes(sig), key_id=signed.key_id)
            )
    # appended bytes (an extra protobuf field the signer never wrote) are not signed either
    with pytest.raises(AssignmentError):
        verifier.verify(
            pb.SignedAssignment(
                assignment=signed.assignment + b"\x42\x01x", signature=signed.signature, key_id=signed.key_id
            )
        )


def test_another_key_or_a_missing_signature_is_refused(
    signer: Signer, verifier: Verifier, tmp_path: Path
) -> None:
    other = Signer.ensure(tmp_path / "other.key")
    with pytest.raises(AssignmentError, match="unknown key"):
        verifier.verify(other.sign(ASSIGNMENT))
    claimed = other.sign(ASSIGNMENT)
    claimed.key_id = signer.key_id
    with pytest.raises(AssignmentError, match="does not verify"):
        verifier.verify(claimed)
    for empty in (pb.SignedAssignment(), pb.SignedAssignment(assignment=signer.sign(ASSIGNMENT).assignment)):
        with pytest.raises(AssignmentError):
            verifier.verify(empty)
    huge = signer.sign(ASSIGNMENT)
    huge.assignment = b"\x0a\x00" * 600
    with pytest.raises(AssignmentError, match="malformed"):
        verifier.verify(huge)


def test_a_verifier_may_trust_several_keys_while_the_signing_key_changes(tmp_path: Path) -> None:
    old, new = Signer.ensure(tmp_path / "old.key"), Signer.ensure(tmp_path / "new.key")
    bundle = tmp_path / "keys.pub"
    bundle.write_bytes(old.public_pem + new.public_pem)
    verifier = Verifier.load(bundle)
    assert verifier.verify(old.sign(ASSIGNMENT)) == verifier.verify(new.sign(ASSIGNMENT)) == ASSIGNMENT
    (tmp_path / "empty.pub").write_bytes(b"")
    with pytest.raises(AssignmentError):
        Verifier.load(tmp_path / "empty.pub")


def test_a_certificate_stands_for_its_public_key(tmp_path: Path) -> None:
    """A Kubernetes TLS Secret of the Ed25519 key (cert-manager's, or the Helm chart's) gives
    gateways a certificate, not a bare public key: its key verifies, a certificate of another key
    type is refused."""

    def certificate(key, public) -> bytes:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "assignments")])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + dt.timedelta(days=1))
            .sign(key, None if isinstance(key, Ed25519PrivateKey) else hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM)

    signer = Signer.ensure(tmp_path / "assignments.key")
    other = Signer.ensure(tmp_path / "other.key")
    key = serialization.load_pem_private_key((tmp_path / "assignments.key").read_bytes(), None)
    (tmp_path / "tls.crt").write_bytes(certificate(key, signer.public_key) + other.public_pem)
    verifier = Verifier.load(tmp_path / "tls.crt")
    assert verifier.verify(signer.sign(ASSIGNMENT)) == verifier.verify(other.sign(ASSIGNMENT)) == ASSIGNMENT
    ec_key = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "ec.crt").write_bytes(certificate(ec_key, ec_key.public_key()))
    with pytest.raises(AssignmentError, match="not an Ed25519 public key"):
        Verifier.load(tmp_path / "ec.crt")
    (tmp_path / "bad.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    with pytest.raises(AssignmentError, match="not a PEM public key or certificate"):
        Verifier.load(tmp_path / "bad.crt")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("run_uid", "../../../../x"),
        ("run_uid", "7095D706-9F8B-4CD6-AFE1-DA8B6FAAFFBF"),
        ("attempt", 0),
        ("host_id", "Python_0"),
        ("host_uid", "../x"),
        ("namespace", ""),
        ("name", "a/b"),
        ("runtime", "py thon"),
    ],
)
def test_an_assignment_holds_only_valid_identifiers(field: str, value: object) -> None:
    with pytest.raises(AssignmentError):
        replace(ASSIGNMENT, **{field: value})


def test_what_verified_is_kept_by_its_bytes(signer: Signer) -> None:
    verifier = Verifier([signer.public_key], cache_size=2)
    signed = [signer.sign(replace(ASSIGNMENT, attempt=a)) for a in (1, 2, 3)]
    first = verifier.verify(signed[0])
    assert verifier.verify(signed[0]) is first
    for s in signed:
        verifier.verify(s)
    assert len(verifier._cache) == 2  # bounded


REPLICA = replace(ASSIGNMENT, function_uid=str(uuid.UUID(int=7)), revision=3)


def test_a_replicas_function_and_revision_are_signed(signer: Signer, verifier: Verifier) -> None:
    signed = signer.sign(REPLICA)
    assert verifier.verify(signed) == REPLICA
    assert signer.sign(ASSIGNMENT).assignment != signed.assignment
    message = pb.Assignment.FromString(signed.assignment)
    for change in ({"function_uid": str(uuid.UUID(int=8))}, {"revision": 4}):
        forged = pb.Assignment.FromString(signed.assignment)
        for key, value in change.items():
            setattr(forged, key, value)
        tampered = pb.SignedAssignment(
            assignment=forged.SerializeToString(), signature=signed.signature, key_id=signed.key_id
        )
        with pytest.raises(AssignmentError):
            verifier.verify(tampered)
    assert message.revision == 3


@pytest.mark.parametrize(
    "change",
    [
        {"function_uid": "../../etc", "revision": 1},
        {"function_uid": str(uuid.UUID(int=7)), "revision": 0},
        {"function_uid": "", "revision": 2},
        {"function_uid": str(uuid.UUID(int=7)), "revision": -1},
    ],
)
def test_a_replica_field_out_of_shape_is_refused(change: dict[str, object]) -> None:
    with pytest.raises(AssignmentError):
        replace(ASSIGNMENT, **change)  # type: ignore[arg-type]
