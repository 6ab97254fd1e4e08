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
