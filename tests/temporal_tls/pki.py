"""A throwaway PKI for the Temporal TLS tests: a CA with a server certificate for 127.0.0.1 and
localhost and a client certificate, and a second CA the proxy does not trust (with its own client
certificate), as PEM files."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from kruntimes.pki import builder


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA the proxy's certificate chains to, and the one it trusts for clients
    server: Pair
    client: Pair  # issued by `ca`
    rogue_ca: Path
    rogue_client: Pair  # issued by `rogue_ca`: refused by the mTLS proxy


Ca = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]
VALIDITY = dt.timedelta(days=1)
SKEW = dt.timedelta(minutes=5)


def _ca(common_name: str) -> Ca:
    now = dt.datetime.now(dt.UTC)
    return builder.build_ca(
        builder.name(common_name, organization=None), not_before=now - SKEW, not_after=now + VALIDITY
    )


def _leaf(directory: Path, name: str, ca: Ca, *, server: bool) -> Pair:
    ca_cert, ca_key = ca
    now = dt.datetime.now(dt.UTC)
    sans: list[x509.GeneralName] = (
        [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        if server
        else [x509.DNSName(name)]
    )
    cert, key = builder.build_leaf(
        builder.name(name, organization=None),
        ca_cert=ca_cert,
        ca_key=ca_key,
        sans=sans,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH],
        not_before=now - SKEW,
        not_after=now + VALIDITY,
    )
    pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
    pair.cert.write_bytes(builder.cert_pem(cert))
    pair.key.write_bytes(builder.key_pem(key))
    pair.key.chmod(0o600)
    return pair


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca("temporal test CA")
    rogue = _ca("rogue CA")
    for path, (cert, _) in ((directory / "ca.crt", ca), (directory / "rogue-ca.crt", rogue)):
        path.write_bytes(builder.cert_pem(cert))
    return Pki(
        ca=directory / "ca.crt",
        server=_leaf(directory, "frontend", ca, server=True),
        client=_leaf(directory, "krt-client", ca, server=False),
        rogue_ca=directory / "rogue-ca.crt",
        rogue_client=_leaf(directory, "rogue-client", rogue, server=False),
    )
