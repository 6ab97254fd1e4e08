"""The platform CA: its key is kept, and it issues each component a short-lived certificate.

A CA directory (mode 0700) holds `ca.crt` and `ca.key` (0600), the CA that signs, and
`bundle.crt`, the CAs every certificate it issues trusts (all of them during a CA rotation,
kruntimes.pki.rotation; without it, the signing CA alone). A component's certificate directory
has the layout of a Kubernetes TLS Secret, so one mounted from a Secret reads the same way:

    tls.crt   the component's certificate (its identity, see kruntimes.pki.identity)
    tls.key   its private key (0600)
    ca.crt    the CA bundle it trusts its peers by (may hold several CAs during a CA change)

Certificates are ECDSA P-256, valid for `lifetime` (30 days unless configured) from a little
before they are issued (clock skew), with both TLS usages; they are renewed once two thirds of
their validity has passed (`renewal_due`), and at once when their ca.crt is not the CA's current
bundle or they were not signed by the CA that signs now (`stale`, what a CA rotation needs):
`renew_if_due` re-issues a directory's certificate with a new key, the same identity, names and
lifetime. Files are replaced by rename, the key first, so a reader sees an old or a new pair, or
for a moment a mismatched one, which it refuses and reads again (kruntimes.pki.material).

`AuthorityWatch` is a CA directory as a reader of it sees it (the worker, which issues host
certificates): loaded again whenever its files change, and a changed set that cannot be used (a
writer between two renames, a broken Secret) is refused with a warning, the previous kept.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, Unpack

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from kruntimes.pki import builder
from kruntimes.pki.identity import Identity, IdentityError, Role, identity_of, role_dns_name

log = logging.getLogger(__name__)

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
BUNDLE = "bundle.crt"
MAX_BUNDLE_BYTES = 256 * 1024
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"

CA_LIFETIME = dt.timedelta(days=3650)
DEFAULT_LIFETIME = dt.timedelta(days=30)
MIN_LIFETIME = dt.timedelta(seconds=1)
MAX_LIFETIME = dt.timedelta(days=397)
RENEW_AFTER = 2 / 3  # of the validity
MAX_SKEW = dt.timedelta(minutes=1)  # how far before issuance a certificate is valid


class AuthorityError(Exception):
    """The CA or a certificate directory cannot be read or written."""


class IssueOptions(TypedDict, total=False):
    """What `Authority.issue` takes beside the identity (and `write` hands on to it)."""

    lifetime: dt.timedelta
    dns_names: Iterable[str]
    ip_addresses: Iterable[str]
    now: dt.datetime | None


@dataclass(frozen=True)
class Issued:
    identity: Identity
    cert_pem: bytes
    key_pem: bytes
    not_before: dt.datetime
    not_after: dt.datetime


def write_private(path: Path, data: bytes) -> None:
    """Replace `path` by rename with a file only its owner may read (0600)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_public(path: Path, data: bytes) -> None:
    """Replace `path` by rename (0644)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def read_if_present(path: Path) -> bytes | None:
    """The bytes of `path`; None when there is no such file; AuthorityError when it cannot be read."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise AuthorityError(f"cannot read {path}: {e.strerror or e}") from e


def private_directory(path: Path) -> Path:
    """`path` as a directory only its owner may enter (0700), created if missing."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)
    return path


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def check_lifetime(lifetime: dt.timedelta) -> dt.timedelta:
    if not MIN_LIFETIME <= lifetime <= MAX_LIFETIME:
        raise ValueError(f"a certificate lifetime must be within [{MIN_LIFETIME}, {MAX_LIFETIME}]")
    return lifetime


def renewal_due(cert: x509.Certificate) -> dt.datetime:
    """When `cert` is due for renewal: two thirds into its validity."""
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return start + (end - start) * RENEW_AFTER


def read_bundle(pem: bytes) -> list[x509.Certificate]:
    """The CAs of a bundle: at least one, each a self-signed CA certificate whose signature holds;
    ValueError naming what is wrong otherwise (a partial or tampered file)."""
    if len(pem) > MAX_BUNDLE_BYTES:
        raise ValueError(f"the CA bundle is larger than {MAX_BUNDLE_BYTES} bytes")
    if pem.count(b"-----BEGIN") != pem.count(b"-----END"):
        raise ValueError("the CA bundle ends inside a certificate")
    certs = x509.load_pem_x509_certificates(pem)  # ValueError when empty or malformed
    for cert in certs:
        try:
            constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
            cert.verify_directly_issued_by(cert)
        except (x509.ExtensionNotFound, InvalidSignature, TypeError) as e:
            raise ValueError(
                f"the CA bundle holds {cert.subject.rfc4514_string()}, not a self-signed CA"
            ) from e
        if not constraints.ca:
            raise ValueError(f"the CA bundle holds {cert.subject.rfc4514_string()}, not a CA")
    return certs


class Authority:
    """The platform CA (certificate and private key) and the bundle its certificates carry."""

    def __init__(
        self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, *, bundle_pem: bytes | None = None
    ) -> None:
        self.cert = cert
        self.key = key
        self.cert_pem = builder.cert_pem(cert)
        self.bundle_pem = bundle_pem or self.cert_pem

    @classmethod
    def ensure(cls, directory: Path) -> Authority:
        """The CA kept in `directory` (0700); a new one when it holds none."""
        private_directory(directory)
        if (directory / CA_CERT).exists() or (directory / CA_KEY).exists():
            return cls.load(directory)
        now = _now()
        subject = builder.name("kruntimes platform CA")
        cert, key = builder.build_ca(subject, not_before=now - MAX_SKEW, not_after=now + CA_LIFETIME)
        write_private(directory / CA_KEY, builder.key_pem(key))
        write_public(directory / CA_CERT, builder.cert_pem(cert))
        return cls(cert, key)

    @classmethod
    def load(cls, directory: Path) -> Authority:
        """The CA of `directory`: ca.crt and ca.key, with bundle.crt when there is one (it must
        hold the signing CA)."""
        try:
            cert = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
            key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), password=None)
        except (OSError, ValueError) as e:
            raise AuthorityError(f"cannot read the CA in {directory}: {e}") from e
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise AuthorityError(f"the CA key in {directory} is not an EC key")
        if cert.public_key() != key.public_key():
            raise AuthorityError(f"the CA certificate and key in {directory} do not belong together")
        bundle_pem = read_if_present(directory / BUNDLE)
        if bundle_pem is not None:
            try:
                bundle = read_bundle(bundle_pem)
            except ValueError as e:
                raise AuthorityError(f"{directory / BUNDLE}: {e}") from e
            if cert not in bundle:
                raise AuthorityError(f"{directory / BUNDLE} does not hold the CA of {directory / CA_CERT}")
        return cls(cert, key, bundle_pem=bundle_pem)

    def stale(self, cert: x509.Certificate, bundle_pem: bytes | None, *, now: dt.datetime) -> bool:
        """Whether a certificate this CA issued is to be issued again: due (two thirds of its
        validity passed, or not valid yet), not signed by this CA, or handed out with another
        bundle than this CA's current one (`bundle_pem`: the ca.crt it came with)."""
        if now >= renewal_due(cert) or now < cert.not_valid_before_utc or bundle_pem != self.bundle_pem:
            return True
        try:
            cert.verify_directly_issued_by(self.cert)
        except (ValueError, TypeError, InvalidSignature):
            return True
        return False

    def issue(
        self,
        identity: Identity,
        *,
        lifetime: dt.timedelta = DEFAULT_LIFETIME,
        dns_names: Iterable[str] = (),
        ip_addresses: Iterable[str] = (),
        now: dt.datetime | None = None,
    ) -> Issued:
        """A certificate for `identity` (its URI SAN, its and its role's DNS names, plus the names
        and addresses a server is reached at) and its new key."""
        check_lifetime(lifetime)
        now = now or _now()
        names = [identity.dns_name, role_dns_name(identity.role), *dns_names]
        sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity.uri)]
        sans += [x509.DNSName(n) for n in dict.fromkeys(names)]
        sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in dict.fromkeys(ip_addresses)]
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        if identity.role is not Role.CONTROL_PLANE:  # the control plane serves nothing
            usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
        not_before = now - min(MAX_SKEW, lifetime / 10)
        not_after = now + lifetime
        cert, key = builder.build_leaf(
            builder.name(identity.uri),
            ca_cert=self.cert,
            ca_key=self.key,
            sans=sans,
            usages=usages,
            not_before=not_before,
            not_after=not_after,
        )
        return Issued(
            identity=identity,
            cert_pem=builder.cert_pem(cert),
            key_pem=builder.key_pem(key),
            not_before=not_before,
            not_after=not_after,
        )

    def write(self, directory: Path, identity: Identity, **options: Unpack[IssueOptions]) -> Issued:
        """Issue a certificate for `identity` (as `issue` does) into the certificate directory
        `directory` (0700)."""
        issued = self.issue(identity, **options)
        private_directory(directory)
        files = self.directory_files(issued)
        write_private(directory / TLS_KEY, files.pop(TLS_KEY))
        for name, content in files.items():
            write_public(directory / name, content)
        return issued

    def directory_files(self, issued: Issued) -> dict[str, bytes]:
        """The files of a certificate directory holding `issued`: name -> content (the key first)."""
        return {TLS_KEY: issued.key_pem, TLS_CERT: issued.cert_pem, CA_CERT: self.bundle_pem}

    def renew_if_due(self, directory: Path, *, now: dt.datetime | None = None) -> Issued | None:
        """Re-issue the certificate in `directory` when it is `stale` (the same identity, names and
        lifetime, a new key); None when it is not."""
        try:
            cert = x509.load_pem_x509_certificate((directory / TLS_CERT).read_bytes())
            identity = identity_of(cert)
        except (OSError, ValueError, IdentityError) as e:
            raise AuthorityError(f"cannot read the certificate in {directory}: {e}") from e
        try:
            bundle_pem: bytes | None = (directory / CA_CERT).read_bytes()
        except OSError:
            bundle_pem = None
        now = now or _now()
        if not self.stale(cert, bundle_pem, now=now):
            return None
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        implied = {identity.dns_name, role_dns_name(identity.role)}
        dns = [n for n in sans.get_values_for_type(x509.DNSName) if n not in implied]
        ips = [str(a) for a in sans.get_values_for_type(x509.IPAddress)]
        skew = min(MAX_SKEW, (cert.not_valid_after_utc - cert.not_valid_before_utc) / 11)
        lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc - skew
        lifetime = min(max(lifetime, MIN_LIFETIME), MAX_LIFETIME)
        return self.write(directory, identity, lifetime=lifetime, dns_names=dns, ip_addresses=ips, now=now)


_CA_FILES = (CA_CERT, CA_KEY, BUNDLE)


def file_stamps(directory: Path, names: tuple[str, ...]) -> tuple[tuple[int, int, int], ...]:
    """What tells that files of `directory` changed (mtime, size, inode each; zeros when
    missing): the CA directory's here, a certificate directory's in PeerTLS."""
    stamps = []
    for name in names:
        try:
            st = os.stat(directory / name)
        except OSError:
            stamps.append((0, 0, 0))
        else:
            stamps.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(stamps)


class AuthorityWatch:
    """The CA of a directory, loaded again when its files change (looked at on every `current`:
    a few stat calls, made only when a certificate is issued or renewal is checked). Thread-safe."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._stamp = file_stamps(directory, _CA_FILES)
        self._authority = Authority.load(directory)

    def current(self) -> Authority:
        """The CA as its files are now; the previous one when they changed but cannot be used."""
        with self._lock:
            stamp = file_stamps(self.directory, _CA_FILES)
            if stamp == self._stamp:
                return self._authority
            try:
                authority = Authority.load(self.directory)
            except AuthorityError as e:
                log.warning("the platform CA files changed but cannot be used; keeping the previous: %s", e)
                return self._authority  # the stamp is not taken: looked at again next time
            self._stamp = stamp
            changed = (authority.cert_pem, authority.bundle_pem) != (
                self._authority.cert_pem,
                self._authority.bundle_pem,
            )
            self._authority = authority
        if changed:
            log.info(
                "platform CA reloaded",
                extra={
                    "ca": authority.cert.subject.rfc4514_string(),
                    "bundle": len(read_bundle(authority.bundle_pem)),
                },
            )
        return authority
