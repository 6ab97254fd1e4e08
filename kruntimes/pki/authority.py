"""The platform CA: its key is kept, and it issues each component a short-lived certificate.

A CA directory (mode 0700) holds `ca.crt` and `ca.key` (0600). A component's certificate directory
has the layout of a Kubernetes TLS Secret, so one mounted from a Secret reads the same way:

    tls.crt   the component's certificate (its identity, see kruntimes.pki.identity)
    tls.key   its private key (0600)
    ca.crt    the CA bundle it trusts its peers by (may hold several CAs during a CA change)

Certificates are ECDSA P-256, valid for `lifetime` (30 days unless configured) from a little
before they are issued (clock skew), with both TLS usages; they are renewed once two thirds of
their validity has passed (`renewal_due`): `renew_if_due` re-issues a directory's certificate with
a new key, the same identity, names and lifetime. Files are replaced by rename, the key first, so
a reader sees an old or a new pair, or for a moment a mismatched one, which it refuses and reads
again (kruntimes.pki.material).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from kruntimes.pki import builder
from kruntimes.pki.identity import Identity, IdentityError, Role, identity_of, role_dns_name

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
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


class Authority:
    """The platform CA (certificate and private key)."""

    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.cert = cert
        self.key = key
        self.cert_pem = builder.cert_pem(cert)

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
        try:
            cert = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
            key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), password=None)
        except (OSError, ValueError) as e:
            raise AuthorityError(f"cannot read the CA in {directory}: {e}") from e
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise AuthorityError(f"the CA key in {directory} is not an EC key")
        if cert.public_key() != key.public_key():
            raise AuthorityError(f"the CA certificate and key in {directory} do not belong together")
        return cls(cert, key)

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

    def write(
        self,
        directory: Path,
        identity: Identity,
        *,
        lifetime: dt.timedelta = DEFAULT_LIFETIME,
        dns_names: Iterable[str] = (),
        ip_addresses: Iterable[str] = (),
        now: dt.datetime | None = None,
    ) -> Issued:
        """Issue a certificate for `identity` into the certificate directory `directory` (0700)."""
        issued = self.issue(
            identity, lifetime=lifetime, dns_names=dns_names, ip_addresses=ip_addresses, now=now
        )
        private_directory(directory)
        write_private(directory / TLS_KEY, issued.key_pem)
        write_public(directory / TLS_CERT, issued.cert_pem)
        write_public(directory / CA_CERT, self.cert_pem)
        return issued

    def renew_if_due(self, directory: Path, *, now: dt.datetime | None = None) -> Issued | None:
        """Re-issue the certificate in `directory` when it is due (the same identity, names and
        lifetime, a new key); None when it is not due yet."""
        try:
            cert = x509.load_pem_x509_certificate((directory / TLS_CERT).read_bytes())
            identity = identity_of(cert)
        except (OSError, ValueError, IdentityError) as e:
            raise AuthorityError(f"cannot read the certificate in {directory}: {e}") from e
        now = now or _now()
        if now < renewal_due(cert):
            return None
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        implied = {identity.dns_name, role_dns_name(identity.role)}
        dns = [n for n in sans.get_values_for_type(x509.DNSName) if n not in implied]
        ips = [str(a) for a in sans.get_values_for_type(x509.IPAddress)]
        skew = min(MAX_SKEW, (cert.not_valid_after_utc - cert.not_valid_before_utc) / 11)
        lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc - skew
        lifetime = min(max(lifetime, MIN_LIFETIME), MAX_LIFETIME)
        return self.write(directory, identity, lifetime=lifetime, dns_names=dns, ip_addresses=ips, now=now)
