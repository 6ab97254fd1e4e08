"""The platform's own Secrets in a namespace, without cert-manager (`krt pki init-cluster`,
workers/pki.py, through the Kubernetes Secret client of workers/pki_secrets.py).

Run as the Helm chart's pre-install/pre-upgrade hook Job, it makes sure these Secrets exist and
hold valid material (all `kubernetes.io/tls`):

    --ca-secret          the platform CA: tls.crt, tls.key (the CA that signs: the worker issues
                         host certificates with it), ca.crt (the bundle every component trusts)
                         and ca-state.json (its rotation: kruntimes.pki.rotation)
    --worker NAME        Secret NAME-peer: the certificate of spiffe://kruntimes.io/control-plane/NAME
    --gateway NAME       Secret NAME-peer: the certificate of spiffe://kruntimes.io/gateway/NAME
                         (repeatable)
    --assignment-secret  the Ed25519 key assignments are signed with (tls.key) and a certificate of
                         it (tls.crt), what gateways verify with

A Secret that is missing is created. One that exists is this command's only if it carries the
label app.kubernetes.io/managed-by=krt-pki and the annotation kruntimes.io/pki-owner=<namespace>/
<release>; any other Secret of that name is refused (nothing is written, the command fails naming
it). One of its own is kept while its material is valid, and re-issued (patched, with its
resourceVersion as a precondition) when it is unreadable, names another identity, was not signed
by the current CA, holds another bundle than the current one, or has passed two thirds of its
validity. The CA itself is changed by a rotation in two phases, one step per run when its time
has come (kruntimes.pki.rotation): once the CA is due (two thirds of its validity), a next CA is
made and published in every bundle while the current one still signs; after an overlap of the
longest certificate lifetime it issues (`--certificate-lifetime`, `--host-certificate-lifetime`,
plus a tenth) the next CA signs; after as long again the old one leaves the bundle. `--rotate-ca`
starts a rotation now. The whole state is one Secret, patched at once, so a run that fails half
way loses nothing, and a second run at the same time changes nothing. An unreadable rotation
state is refused, never replaced by a new CA. The assignment key is never replaced (hosts verify
assignments with it); only its certificate is signed again when due.

The API calls made (the hook Job's Role): secrets get, create and patch, on these names only.
Every API error is wrapped into a `ClusterPkiError`; no key material is ever logged.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kruntimes.api.names import validate_dns1123_label
from kruntimes.pki import builder
from kruntimes.pki import rotation as ca_rotation
from kruntimes.pki.authority import (
    CA_CERT,
    DEFAULT_LIFETIME,
    MAX_SKEW,
    TLS_CERT,
    TLS_KEY,
    Authority,
    AuthorityError,
    check_lifetime,
    renewal_due,
)
from kruntimes.pki.identity import Identity, IdentityError, identity_of

log = logging.getLogger(__name__)

VERBS = frozenset({"get", "create", "patch"})  # on the named Secrets: the hook Job's Role
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "krt-pki"
OWNER_ANNOTATION = "kruntimes.io/pki-owner"
SECRET_TYPE = "kubernetes.io/tls"
STATE_KEY = ca_rotation.STATE  # the CA Secret's rotation state
PEER_SUFFIX = "-peer"
DEFAULT_LEAF_LIFETIME = dt.timedelta(days=365)
ASSIGNMENT_LIFETIME = dt.timedelta(days=36500)
MAX_ATTEMPTS = 3  # a Secret changed by someone else between our read and our write
MAX_VALUE_BYTES = 64 * 1024  # one key of a Secret we read
MAX_GATEWAYS = 16


class ClusterPkiError(Exception):
    """A Secret cannot be made: refused (not ours), or the API failed; the message says which."""


class Outcome(StrEnum):
    CREATED = "created"
    KEPT = "kept"
    RENEWED = "renewed"


@dataclass(frozen=True)
class Plan:
    """What `init-cluster` provisions in one namespace for one release."""

    namespace: str
    release: str
    ca_secret: str
    worker: str | None = None
    gateways: tuple[str, ...] = ()
    assignment_secret: str | None = None
    lifetime: dt.timedelta = DEFAULT_LEAF_LIFETIME
    host_lifetime: dt.timedelta = DEFAULT_LIFETIME  # the worker's host certificates
    rotate_ca: bool = False  # start a CA rotation now, due or not

    def __post_init__(self) -> None:
        validate_dns1123_label(self.namespace, field="namespace")
        validate_dns1123_label(self.release, field="release")
        for name in self.secret_names():
            validate_dns1123_label(name, field="secret")
        for name in (*([self.worker] if self.worker else []), *self.gateways):
            validate_dns1123_label(name, field="identity")
        if len(self.gateways) > MAX_GATEWAYS:
            raise ValueError(f"at most {MAX_GATEWAYS} gateway identities")
        check_lifetime(self.lifetime)
        check_lifetime(self.host_lifetime)

    @property
    def max_leaf_lifetime(self) -> dt.timedelta:
        """The longest lifetime of a certificate the CA issues: a CA rotation's overlap."""
        return max(self.lifetime, self.host_lifetime)

    @property
    def owner(self) -> str:
        return f"{self.namespace}/{self.release}"

    def identities(self) -> list[tuple[str, Identity]]:
        """Each certificate Secret's name and the identity it holds."""
        found = [(f"{self.worker}{PEER_SUFFIX}", Identity.control_plane(self.worker))] if self.worker else []
        return found + [(f"{g}{PEER_SUFFIX}", Identity.gateway(g)) for g in self.gateways]

    def secret_names(self) -> list[str]:
        names = [self.ca_secret, *(name for name, _ in self.identities())]
        return names + ([self.assignment_secret] if self.assignment_secret else [])


# --- the API ----------------------------------------------------------------------------------------


class SecretStore(Protocol):
    """The three Secret calls `ClusterPki` makes (workers/pki_secrets.py holds the Kubernetes one);
    its failures are ClusterPkiError."""

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Secret, or None when there is none of that name."""
        ...

    async def create(self, namespace: str, secret: dict[str, Any]) -> bool:
        """True if created; False when one of that name exists already."""
        ...

    async def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> bool:
        """True if patched; False when it is gone or changed since it was read (the uid and
        resourceVersion in the patch are preconditions)."""
        ...


# --- what a Secret holds ------------------------------------------------------------------------------


def _value(secret: Mapping[str, Any], key: str) -> bytes | None:
    data = secret.get("data") or {}
    text = data.get(key) if isinstance(data, dict) else None
    if not isinstance(text, str) or len(text) > MAX_VALUE_BYTES * 4 // 3 + 4:
        return None
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        return None


def _encode(files: Mapping[str, bytes]) -> dict[str, str]:
    return {key: base64.b64encode(value).decode("ascii") for key, value in files.items()}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _due(cert: x509.Certificate, now: dt.datetime) -> bool:
    return now >= renewal_due(cert) or now < cert.not_valid_before_utc


@dataclass(frozen=True)
class CaState:
    authority: Authority
    bundle: bytes  # ca.crt: the CAs of the rotation (the signing one first)
    rotation: ca_rotation.Rotation | None = None
    steps: tuple[ca_rotation.Step, ...] = ()


def _read_ca(secret: Mapping[str, Any]) -> Authority | None:
    cert_pem, key_pem = _value(secret, TLS_CERT), _value(secret, TLS_KEY)
    if cert_pem is None or key_pem is None:
        return None
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except (ValueError, x509.ExtensionNotFound):
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        return None
    return Authority(cert, key) if constraints.ca else None


def _rotation_of(secret: Mapping[str, Any], now: dt.datetime) -> ca_rotation.Rotation | None:
    """The CA Secret's rotation: its state, else (a Secret made before rotations) its tls.crt and
    tls.key with the other CAs still valid of its ca.crt retired; None when it holds no usable CA.
    Raises AuthorityError when it has a state that cannot be read."""
    data = secret.get("data") or {}
    if isinstance(data, dict) and STATE_KEY in data:
        state = _value(secret, STATE_KEY)
        if state is None:
            raise AuthorityError(f"{STATE_KEY} is not base64 of at most {MAX_VALUE_BYTES} bytes")
        return ca_rotation.Rotation.from_json(state)
    authority = _read_ca(secret)
    if authority is None:
        return None
    retired: dict[bytes, x509.Certificate] = {}
    for cert in _previous_cas(secret):
        if cert.not_valid_after_utc > now and cert.public_key() != authority.cert.public_key():
            retired.setdefault(builder.cert_pem(cert), cert)
    return ca_rotation.Rotation(current=authority, retired=tuple(retired.values())[: ca_rotation.MAX_RETIRED])


def _previous_cas(secret: Mapping[str, Any]) -> list[x509.Certificate]:
    found = []
    for key in (TLS_CERT, CA_CERT):
        pem = _value(secret, key)
        if pem is None:
            continue
        try:
            found += x509.load_pem_x509_certificates(pem)
        except ValueError:
            continue
    return found


def _leaf_valid(secret: Mapping[str, Any], identity: Identity, ca: CaState, now: dt.datetime) -> bool:
    cert_pem, key_pem = _value(secret, TLS_CERT), _value(secret, TLS_KEY)
    if cert_pem is None or key_pem is None or _value(secret, CA_CERT) != ca.bundle:
        return False
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
        cert.verify_directly_issued_by(ca.authority.cert)
        named = identity_of(cert)
    except (ValueError, TypeError, IdentityError, InvalidSignature):
        return False
    return named == identity and key.public_key() == cert.public_key() and not _due(cert, now)


def _assignment_valid(secret: Mapping[str, Any], now: dt.datetime) -> tuple[Ed25519PrivateKey | None, bool]:
    """The assignment key the Secret holds (None: none usable) and whether its certificate is
    still good (it names that key and is not due)."""
    key_pem, cert_pem = _value(secret, TLS_KEY), _value(secret, TLS_CERT)
    if key_pem is None:
        return None, False
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except ValueError:
        return None, False
    if not isinstance(key, Ed25519PrivateKey):
        return None, False
    try:
        cert = x509.load_pem_x509_certificate(cert_pem or b"")
    except ValueError:
        return key, False
    return key, cert.public_key() == key.public_key() and not _due(cert, now)


def assignment_files(key: Ed25519PrivateKey, now: dt.datetime) -> dict[str, bytes]:
    """The assignment key and a self-signed certificate of it (what gateways verify with)."""
    cert = builder.build_key_certificate(
        builder.name("kruntimes assignments"),
        key=key,
        not_before=now - MAX_SKEW,
        not_after=now + ASSIGNMENT_LIFETIME,
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return {TLS_CERT: builder.cert_pem(cert), TLS_KEY: key_pem}


# --- provisioning -----------------------------------------------------------------------------------


class ClusterPki:
    def __init__(self, api: SecretStore, plan: Plan, *, now: dt.datetime | None = None) -> None:
        self.api = api
        self.plan = plan
        self.now = now or _now()

    def _secret(self, name: str, files: Mapping[str, bytes], *, component: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": SECRET_TYPE,
            "metadata": {
                "name": name,
                "namespace": self.plan.namespace,
                "labels": {
                    MANAGED_BY_LABEL: MANAGED_BY,
                    "app.kubernetes.io/part-of": "kruntimes",
                    "app.kubernetes.io/instance": self.plan.release[:63].rstrip("-."),
                    "app.kubernetes.io/component": component,
                },
                "annotations": {OWNER_ANNOTATION: self.plan.owner},
            },
            "data": _encode(files),
        }

    def _check_ours(self, secret: Mapping[str, Any], name: str) -> None:
        metadata = secret.get("metadata") or {}
        labels = metadata.get("labels") or {}
        annotations = metadata.get("annotations") or {}
        if labels.get(MANAGED_BY_LABEL) != MANAGED_BY or annotations.get(OWNER_ANNOTATION) != self.plan.owner:
            raise ClusterPkiError(
                f"secret {self.plan.namespace}/{name} exists and is not managed by krt pki for "
                f"{self.plan.owner} (it lacks the label {MANAGED_BY_LABEL}={MANAGED_BY} or the annotation "
                f"{OWNER_ANNOTATION}={self.plan.owner}): refusing to change it; delete it, or give "
                "its name as an existing Secret instead"
            )

    async def _write(self, name: str, existing: Mapping[str, Any] | None, secret: dict[str, Any]) -> bool:
        """Create the Secret, or patch the one read (its uid and resourceVersion as preconditions);
        False when it changed meanwhile."""
        if existing is None:
            return await self.api.create(self.plan.namespace, secret)
        metadata = existing.get("metadata") or {}
        preconditions = {k: metadata[k] for k in ("uid", "resourceVersion") if metadata.get(k)}
        patch = {
            "metadata": {
                **preconditions,
                "labels": secret["metadata"]["labels"],
                "annotations": secret["metadata"]["annotations"],
            },
            "data": secret["data"],
        }
        return await self.api.patch(self.plan.namespace, name, patch)

    async def preflight(self) -> None:
        """Refuse before writing anything if any of the Secrets exists and is not ours."""
        for name in self.plan.secret_names():
            existing = await self.api.read(self.plan.namespace, name)
            if existing is not None:
                self._check_ours(existing, name)

    async def ensure_ca(self) -> tuple[CaState, Outcome]:
        """The CA Secret with its rotation moved along to now (at most one step per phase)."""
        name = self.plan.ca_secret
        for _ in range(MAX_ATTEMPTS):
            existing = await self.api.read(self.plan.namespace, name)
            rotation = None
            if existing is not None:
                self._check_ours(existing, name)
                try:
                    rotation = _rotation_of(existing, self.now)
                except AuthorityError as e:
                    raise ClusterPkiError(
                        f"secret {self.plan.namespace}/{name}: {e}: refusing to replace the CA; repair "
                        f"or delete the key {STATE_KEY}"
                    ) from e
            if rotation is None:
                rotation = ca_rotation.Rotation(current=ca_rotation.new_ca(self.now))
            rotation, steps = rotation.advance(
                now=self.now, max_leaf_lifetime=self.plan.max_leaf_lifetime, start=self.plan.rotate_ca
            )
            authority = rotation.authority()
            state = CaState(authority, authority.bundle_pem, rotation, tuple(steps))
            files = {
                TLS_CERT: authority.cert_pem,
                TLS_KEY: builder.key_pem(authority.key),
                CA_CERT: authority.bundle_pem,
                STATE_KEY: rotation.to_json(),
            }
            if existing is not None and all(_value(existing, k) == v for k, v in files.items()):
                return state, Outcome.KEPT
            if await self._write(name, existing, self._secret(name, files, component="pki")):
                return state, Outcome.CREATED if existing is None else Outcome.RENEWED
        raise ClusterPkiError(f"secret {self.plan.namespace}/{name} kept changing while it was written")

    async def ensure_leaf(self, name: str, identity: Identity, ca: CaState) -> Outcome:
        for _ in range(MAX_ATTEMPTS):
            existing = await self.api.read(self.plan.namespace, name)
            if existing is not None:
                self._check_ours(existing, name)
                if _leaf_valid(existing, identity, ca, self.now):
                    return Outcome.KEPT
            issued = ca.authority.issue(identity, lifetime=self.plan.lifetime, now=self.now)
            files = {TLS_CERT: issued.cert_pem, TLS_KEY: issued.key_pem, CA_CERT: ca.bundle}
            if await self._write(name, existing, self._secret(name, files, component=identity.role)):
                return Outcome.CREATED if existing is None else Outcome.RENEWED
        raise ClusterPkiError(f"secret {self.plan.namespace}/{name} kept changing while it was written")

    async def ensure_assignment_key(self, name: str) -> Outcome:
        for _ in range(MAX_ATTEMPTS):
            existing = await self.api.read(self.plan.namespace, name)
            key: Ed25519PrivateKey | None = None
            if existing is not None:
                self._check_ours(existing, name)
                key, good = _assignment_valid(existing, self.now)
                if good:
                    return Outcome.KEPT
            files = assignment_files(key or Ed25519PrivateKey.generate(), self.now)
            if await self._write(name, existing, self._secret(name, files, component="pki")):
                return Outcome.CREATED if existing is None else Outcome.RENEWED
        raise ClusterPkiError(f"secret {self.plan.namespace}/{name} kept changing while it was written")

    async def run(self) -> dict[str, Outcome]:
        """Make every Secret of the plan; what happened to each, by name."""
        await self.preflight()
        outcomes: dict[str, Outcome] = {}
        ca, outcomes[self.plan.ca_secret] = await self.ensure_ca()
        for step in ca.steps:
            log.info("platform CA rotation: %s", ca_rotation.describe(step, ca.rotation))
        for name, identity in self.plan.identities():
            outcomes[name] = await self.ensure_leaf(name, identity, ca)
        if self.plan.assignment_secret:
            name = self.plan.assignment_secret
            outcomes[name] = await self.ensure_assignment_key(name)
        return outcomes
