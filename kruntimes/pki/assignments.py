"""Signed assignments: the control plane's word that one attempt of a Run belongs to one host.

The worker's register activity signs an `Assignment` (run uid, attempt, host id, host uid,
namespace, name, runtime) with the control plane's Ed25519 key; hosts and gateways hold only the
public key. A host registers a function only with a valid assignment naming that run, attempt and
itself (runtime/service.py); its heartbeats carry the assignment of each registration, and a
gateway routes only to registrations whose assignment verifies and names the host whose
certificate sent the beat (gateway/routes.py). So neither a process on the machine nor a
compromised host can claim a Run it was not given: it would need the private key.

Encoding: the signed bytes are the `Assignment` protobuf message serialized deterministically by
the signer, carried as they are (`SignedAssignment.assignment`); the signature covers
`CONTEXT + those bytes`, so verification never re-encodes and a verifier parses only what
verified. `key_id` names the public key (the first 8 bytes of the SHA-256 of its raw form, hex),
so a public key file may hold several keys while the signing key changes.

Errors: `AssignmentError` (unreadable, unknown key, bad signature, invalid field) — one message,
never key material.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from google.protobuf.message import DecodeError

from kruntimes.api.names import validate_dns1123_label, validate_run_uid
from kruntimes.pki.authority import write_private, write_public
from kruntimes.rpc.v1 import runtime_pb2 as pb

CONTEXT = b"kruntimes.io/assignment/v1\x00"
MAX_ASSIGNMENT_BYTES = 1024
SIGNATURE_BYTES = 64
MAX_ATTEMPT = 2**31 - 1
MAX_REVISION = 2**31 - 1
MAX_PUBLIC_KEYS = 16
DEFAULT_CACHE_SIZE = 1 << 17  # verified assignments kept (a route of each registration of each host)
_HOST_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# A public key file holds PEM public keys, or certificates whose keys are the public keys (the
# shape a Kubernetes TLS Secret of an Ed25519 key has, e.g. one made by cert-manager or Helm).
_PEM_PUBLIC = re.compile(
    rb"-----BEGIN (PUBLIC KEY|CERTIFICATE)-----.+?-----END \1-----",
    re.DOTALL,
)


class AssignmentError(Exception):
    """The assignment cannot be trusted: unreadable, unknown key, bad signature or invalid field."""


@dataclass(frozen=True, slots=True)
class SignedAssignment:
    run_uid: str
    attempt: int
    host_id: str
    host_uid: str
    namespace: str
    name: str
    runtime: str
    # a Function's replica: the Function's uid and the revision it runs ("" and 0 otherwise)
    function_uid: str = ""
    revision: int = 0

    def __post_init__(self) -> None:
        try:
            validate_run_uid(self.run_uid)
            if self.function_uid:
                validate_run_uid(self.function_uid, field="function_uid")
            for field in ("host_id", "namespace", "name", "runtime"):
                validate_dns1123_label(getattr(self, field), field=field)
        except ValueError as e:
            raise AssignmentError(f"assignment: {e}") from None
        if not 1 <= self.attempt <= MAX_ATTEMPT:
            raise AssignmentError(f"assignment: attempt {self.attempt} is out of bounds")
        if not 0 <= self.revision <= MAX_REVISION or bool(self.function_uid) != bool(self.revision):
            raise AssignmentError(f"assignment: revision {self.revision} does not fit its function uid")
        if not _HOST_UID.fullmatch(self.host_uid):
            raise AssignmentError(f"assignment: host uid {self.host_uid!r:.80} is not an identifier")

    def encode(self) -> bytes:
        return pb.Assignment(
            run_uid=self.run_uid,
            attempt=self.attempt,
            host_id=self.host_id,
            host_uid=self.host_uid,
            namespace=self.namespace,
            name=self.name,
            runtime=self.runtime,
            function_uid=self.function_uid,
            revision=self.revision,
        ).SerializeToString(deterministic=True)

    @classmethod
    def decode(cls, data: bytes) -> SignedAssignment:
        try:
            msg = pb.Assignment.FromString(data)
        except DecodeError:
            raise AssignmentError("assignment: not an Assignment message") from None
        return cls(
            run_uid=msg.run_uid,
            attempt=msg.attempt,
            host_id=msg.host_id,
            host_uid=msg.host_uid,
            namespace=msg.namespace,
            name=msg.name,
            runtime=msg.runtime,
            function_uid=msg.function_uid,
            revision=msg.revision,
        )


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def public_pem(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


class Signer:
    """The control plane's signing key."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        self.public_key = key.public_key()
        self.key_id = key_id(self.public_key)
        self.public_pem = public_pem(self.public_key)

    @classmethod
    def ensure(cls, path: Path) -> Signer:
        """The key kept at `path` (0600), created when missing; its public key is written beside it
        (`<path>` with suffix `.pub`) for hosts and gateways."""
        if path.exists():
            signer = cls.load(path)
        else:
            key = Ed25519PrivateKey.generate()
            write_private(
                path,
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                ),
            )
            signer = cls(key)
        public = path.with_suffix(".pub")
        if not public.exists() or public.read_bytes() != signer.public_pem:
            write_public(public, signer.public_pem)
        return signer

    @classmethod
    def load(cls, path: Path) -> Signer:
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (OSError, ValueError) as e:
            raise AssignmentError(f"cannot read the assignment key {path}: {type(e).__name__}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise AssignmentError(f"the assignment key {path} is not an Ed25519 key")
        return cls(key)

    def sign(self, assignment: SignedAssignment) -> pb.SignedAssignment:
        data = assignment.encode()
        return pb.SignedAssignment(
            assignment=data, signature=self._key.sign(CONTEXT + data), key_id=self.key_id
        )


class Verifier:
    """Verifies signed assignments against one or more public keys; what verified is kept (by its
    bytes, up to `cache_size` entries), so a heartbeat's unchanged registrations cost a lookup."""

    def __init__(self, keys: Iterable[Ed25519PublicKey], *, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self._keys = {key_id(k): k for k in keys}
        if not self._keys:
            raise AssignmentError("no public key to verify assignments with")
        self._cache: dict[tuple[bytes, bytes], SignedAssignment] = {}
        self._cache_size = cache_size
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: Path, **kwargs: int) -> Verifier:
        """The public keys (PEM, one or more; a certificate stands for its public key) in the file
        at `path`."""
        try:
            data = path.read_bytes()
        except OSError as e:
            raise AssignmentError(f"cannot read the assignment public key {path}: {e.strerror}") from None
        keys = []
        for match in list(_PEM_PUBLIC.finditer(data))[: MAX_PUBLIC_KEYS + 1]:
            block = match.group(0)
            try:
                key: object = (
                    x509.load_pem_x509_certificate(block).public_key()
                    if match.group(1) == b"CERTIFICATE"
                    else serialization.load_pem_public_key(block)
                )
            except ValueError:
                raise AssignmentError(f"{path}: not a PEM public key or certificate") from None
            if not isinstance(key, Ed25519PublicKey):
                raise AssignmentError(f"{path}: not an Ed25519 public key")
            keys.append(key)
        if len(keys) > MAX_PUBLIC_KEYS:
            raise AssignmentError(f"{path}: more than {MAX_PUBLIC_KEYS} public keys")
        return cls(keys, **kwargs)

    def verify(self, signed: pb.SignedAssignment) -> SignedAssignment:
        """The assignment `signed` carries, if its signature verifies; else AssignmentError."""
        data, signature = signed.assignment, signed.signature
        found = self._cache.get((data, signature))
        if found is not None:
            return found
        if not data or len(data) > MAX_ASSIGNMENT_BYTES or len(signature) != SIGNATURE_BYTES:
            raise AssignmentError("no signed assignment" if not data else "malformed signed assignment")
        key = self._keys.get(signed.key_id)
        if key is None:
            raise AssignmentError("the assignment is signed with an unknown key")
        try:
            key.verify(signature, CONTEXT + data)
        except InvalidSignature:
            raise AssignmentError("the assignment's signature does not verify") from None
        assignment = SignedAssignment.decode(data)
        with self._lock:
            if len(self._cache) >= self._cache_size:
                del self._cache[next(iter(self._cache))]
            self._cache[(data, signature)] = assignment
        return assignment
