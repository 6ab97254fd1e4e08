"""The platform's own CA and serving certificates (embedded mode and tests), made with
kruntimes.pki.builder.

The serving certificate names IP:127.0.0.1 and DNS:localhost (plus any extra names), so clients
verify it against the CA bundle that Run endpoints carry.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from cryptography.x509.oid import ExtendedKeyUsageOID

from kruntimes.pki import builder

CA_DAYS = 3650
SERVING_DAYS = 365


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path
    cert: Path
    key: Path


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)


def ensure_tls(directory: Path, *, names: tuple[str, ...] = ()) -> TlsFiles:
    """Create a CA and a serving certificate in `directory` unless they exist (kept on restart)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    files = TlsFiles(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    if files.ca_cert.exists() and files.cert.exists() and files.key.exists():
        return files
    now = dt.datetime.now(dt.UTC)
    skew, ca_end = dt.timedelta(minutes=5), now + dt.timedelta(days=CA_DAYS)
    ca_cert, ca_key = builder.build_ca(builder.name("kruntimes CA"), not_before=now - skew, not_after=ca_end)
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.DNSName("localhost"),
    ]
    sans += [x509.DNSName(n) for n in names]
    cert, key = builder.build_leaf(
        builder.name("kruntimes gateway"),
        ca_cert=ca_cert,
        ca_key=ca_key,
        sans=sans,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        not_before=now - skew,
        not_after=now + dt.timedelta(days=SERVING_DAYS),
    )
    files.ca_cert.write_bytes(builder.cert_pem(ca_cert))
    files.cert.write_bytes(builder.cert_pem(cert))
    _write_private(files.key, builder.key_pem(key))
    # the CA key is not kept: nothing else is ever signed with it
    return files


# -- the front of the embedded Temporal dev server ------------------------------------------------

FRONT_DAYS = 365
FRONT_RENEW_BEFORE = dt.timedelta(days=30)


@dataclass(frozen=True)
class FrontTls:
    """The front's CA, its serving certificate, and the owner's client certificate (the only one
    the front lets in)."""

    ca_cert: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path


def _front_files(directory: Path) -> FrontTls:
    return FrontTls(
        directory / "ca.crt",
        directory / "tls.crt",
        directory / "tls.key",
        directory / "client.crt",
        directory / "client.key",
    )


def _front_due(files: FrontTls, now: dt.datetime) -> bool:
    """Whether the front's files must be made anew: one missing, unreadable, not matching the
    others (a start that died while writing them), or a certificate near its end."""
    try:
        ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
        pairs = [
            (x509.load_pem_x509_certificate(cert.read_bytes()), load_pem_private_key(key.read_bytes(), None))
            for cert, key in ((files.cert, files.key), (files.client_cert, files.client_key))
        ]
        for cert, key in pairs:
            cert.verify_directly_issued_by(ca)
            if cert.public_key() != key.public_key():
                return True
    except (OSError, ValueError, TypeError, InvalidSignature):
        return True
    return any(cert.not_valid_after_utc - now < FRONT_RENEW_BEFORE for cert, _ in pairs)


def ensure_front_tls(directory: Path, *, now: dt.datetime | None = None) -> FrontTls:
    """A CA, the front's serving certificate (IP:127.0.0.1, DNS:localhost) and the owner's client
    certificate in `directory` (0700; keys 0600): kept while they have FRONT_RENEW_BEFORE left,
    else all made anew (the CA's key is not kept: it signs these two and nothing else)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)
    files = _front_files(directory)
    now = now or dt.datetime.now(dt.UTC)
    if not _front_due(files, now):
        return files
    skew, end = dt.timedelta(minutes=5), now + dt.timedelta(days=FRONT_DAYS)
    ca_cert, ca_key = builder.build_ca(
        builder.name("kruntimes Temporal front CA"), not_before=now - skew, not_after=end
    )
    server, server_key = builder.build_leaf(
        builder.name("kruntimes Temporal front"),
        ca_cert=ca_cert,
        ca_key=ca_key,
        sans=[x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")],
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        not_before=now - skew,
        not_after=end,
    )
    client, client_key = builder.build_leaf(
        builder.name("kruntimes platform owner"),
        ca_cert=ca_cert,
        ca_key=ca_key,
        sans=[x509.DNSName("owner.kruntimes.local")],
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
        not_before=now - skew,
        not_after=end,
    )
    _write_private(files.key, builder.key_pem(server_key))
    _write_private(files.client_key, builder.key_pem(client_key))
    files.cert.write_bytes(builder.cert_pem(server))
    files.client_cert.write_bytes(builder.cert_pem(client))
    files.ca_cert.write_bytes(builder.cert_pem(ca_cert))
    return files
