"""`krt pki init-cluster`: the platform's own Secrets in a namespace, without cert-manager.

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

import argparse
import asyncio
import base64
import datetime as dt
import json
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import aiohttp
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException

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
API_TIMEOUT_S = 10.0
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


class SecretApi:
    """The three Secret calls, answering (status, JSON body); transport failures and answers that
    are not JSON become ClusterPkiError."""

    def __init__(self, api_client: k8s.ApiClient, *, timeout_s: float = API_TIMEOUT_S) -> None:
        self.core = k8s.CoreV1Api(api_client)
        self.timeout_s = timeout_s

    async def _call(self, what: str, method: Any, *args: Any) -> tuple[int, dict[str, Any]]:
        try:
            response = await method(*args, _preload_content=False, _request_timeout=self.timeout_s)
            async with response:
                status, raw = response.status, await response.read()
        except ApiException as e:
            raise ClusterPkiError(f"{what}: the Kubernetes client failed: {e.reason}") from e
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise ClusterPkiError(f"{what}: the API server is unreachable: {type(e).__name__}: {e}") from e
        try:
            body = json.loads(raw) if raw else {}
        except ValueError as e:
            raise ClusterPkiError(f"{what}: the API server answered {status} without JSON") from e
        return status, body if isinstance(body, dict) else {}

    @staticmethod
    def _fail(what: str, status: int, body: Mapping[str, Any]) -> ClusterPkiError:
        message = str(body.get("message") or body.get("reason") or "")[:512]
        return ClusterPkiError(f"{what}: the API server answered {status}: {message}")

    async def _answer(
        self, what: str, method: Any, *args: Any, absent: tuple[int, ...]
    ) -> dict[str, Any] | None:
        """The body of a 2xx answer; None for a status in `absent`; any other is ClusterPkiError."""
        status, body = await self._call(what, method, *args)
        if status in absent:
            return None
        if not 200 <= status < 300:
            raise self._fail(what, status, body)
        return body

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        what = f"get secret {namespace}/{name}"
        return await self._answer(what, self.core.read_namespaced_secret, name, namespace, absent=(404,))

    async def create(self, namespace: str, secret: dict[str, Any]) -> bool:
        """True if created; False when one of that name exists already."""
        what = f"create secret {namespace}/{secret['metadata']['name']}"
        created = await self._answer(
            what, self.core.create_namespaced_secret, namespace, secret, absent=(409,)
        )
        return created is not None

    async def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> bool:
        """True if patched; False when it is gone or changed since it was read (the uid and
        resourceVersion in the patch are preconditions)."""
        what = f"patch secret {namespace}/{name}"
        patched = await self._answer(
            what, self.core.patch_namespaced_secret, name, namespace, patch, absent=(404, 409)
        )
        return patched is not None


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
    def __init__(self, api: SecretApi, plan: Plan, *, now: dt.datetime | None = None) -> None:
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


# --- the command ------------------------------------------------------------------------------------


async def connect(*, api_server: str | None, kubeconfig: str | None = None) -> k8s.ApiClient:
    """An API client: `api_server` as given, else the pod's service account, else a kubeconfig."""
    configuration = k8s.Configuration()
    try:
        if api_server:
            configuration.host = api_server.rstrip("/")
        elif os.environ.get("KUBERNETES_SERVICE_HOST") and kubeconfig is None:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            await k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except (ConfigException, OSError, ValueError, KeyError, TypeError) as e:
        raise ClusterPkiError(f"cannot load the Kubernetes configuration: {e}") from e
    return k8s.ApiClient(configuration)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="krt pki", description="the platform's certificates on a cluster")
    commands = top.add_subparsers(dest="command", required=True)
    init = commands.add_parser(
        "init-cluster",
        help="create or renew the platform CA, worker and gateway certificates and the assignment key",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    init.add_argument("--namespace", required=True, help="the namespace of the Secrets")
    init.add_argument("--release", required=True, help="the release owning them (their owner annotation)")
    init.add_argument("--ca-secret", required=True, help="the platform CA's Secret")
    init.add_argument("--worker", help="the worker's identity name (its Secret: NAME-peer)")
    init.add_argument(
        "--gateway", action="append", default=[], help="a gateway identity name (its Secret: NAME-peer)"
    )
    init.add_argument("--assignment-secret", help="the assignment key's Secret (omit: one exists already)")
    init.add_argument(
        "--certificate-lifetime",
        type=float,
        default=DEFAULT_LEAF_LIFETIME.total_seconds(),
        help="seconds the worker's and gateways' certificates are valid (renewed after two thirds)",
    )
    init.add_argument(
        "--host-certificate-lifetime",
        type=float,
        default=DEFAULT_LIFETIME.total_seconds(),
        help="seconds the host certificates the worker issues are valid (the worker's own flag): a CA "
        "rotation waits for the longest lifetime between its phases",
    )
    init.add_argument(
        "--rotate-ca",
        action="store_true",
        help="start a CA rotation now (publish the next CA), even if the CA is not due yet",
    )
    init.add_argument("--api-server", help="the API server's URL (default: in-cluster, else kubeconfig)")
    init.add_argument("--kubeconfig", help="a kubeconfig file (default: in-cluster, else ~/.kube/config)")
    return top


def plan_from(args: argparse.Namespace) -> Plan:
    return Plan(
        namespace=args.namespace,
        release=args.release,
        ca_secret=args.ca_secret,
        worker=args.worker,
        gateways=tuple(dict.fromkeys(args.gateway)),
        assignment_secret=args.assignment_secret,
        lifetime=dt.timedelta(seconds=args.certificate_lifetime),
        host_lifetime=dt.timedelta(seconds=args.host_certificate_lifetime),
        rotate_ca=args.rotate_ca,
    )


async def init_cluster(plan: Plan, *, api_server: str | None, kubeconfig: str | None) -> dict[str, Outcome]:
    api_client = await connect(api_server=api_server, kubeconfig=kubeconfig)
    try:
        return await ClusterPki(SecretApi(api_client), plan).run()
    finally:
        await api_client.close()


def main(argv: list[str]) -> int:
    """`krt pki ...`: 0 when every Secret is in place, 1 when one is refused or the API fails,
    2 for a wrong command line."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    args = parser().parse_args(argv)
    try:
        plan = plan_from(args)
    except ValueError as e:
        print(f"krt pki: {e}", file=sys.stderr)
        return 2
    try:
        outcomes = asyncio.run(init_cluster(plan, api_server=args.api_server, kubeconfig=args.kubeconfig))
    except ClusterPkiError as e:
        print(f"krt pki: {e}", file=sys.stderr)
        return 1
    for name, outcome in outcomes.items():
        print(f"secret {plan.namespace}/{name}: {outcome}")
    return 0
