"""The platform PKI (kruntimes.pki): identities, the CA that is kept, issuing and renewing
certificates, and reading a certificate directory as TLS material that follows its files."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from kruntimes.pki import (
    CA_CERT,
    TLS_CERT,
    TLS_KEY,
    Authority,
    Identity,
    IdentityError,
    PeerTLS,
    PeerTLSError,
    Role,
    identity_of,
    identity_of_peercert,
    renewal_due,
    role_dns_name,
)

HOST = Identity.host(runtime="python", host_id="python-0")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_identities_are_uris_and_dns_names_of_the_trust_domain() -> None:
    assert HOST.uri == "spiffe://kruntimes.io/host/python/python-0"
    assert HOST.dns_name == "python-0.python.host.kruntimes.internal"
    assert (HOST.runtime, HOST.host_id) == ("python", "python-0")
    gateway = Identity.gateway("gw-1")
    assert gateway.uri == "spiffe://kruntimes.io/gateway/gw-1"
    assert gateway.dns_name == "gw-1.gateway.kruntimes.internal"
    assert Identity.control_plane("w").uri == "spiffe://kruntimes.io/control-plane/w"
    assert role_dns_name(Role.GATEWAY) == "gateway.kruntimes.internal"
    for identity in (HOST, gateway, Identity.control_plane("w")):
        assert Identity.parse(identity.uri) == identity


@pytest.mark.parametrize(
    "uri",
    [
        "spiffe://evil.io/host/python/python-0",
        "spiffe://kruntimes.io/admin/root",
        "spiffe://kruntimes.io/host/python",
        "spiffe://kruntimes.io/host/python/python-0/x",
        "spiffe://kruntimes.io/host/../python-0",
        "spiffe://kruntimes.io/gateway/GW",
        "spiffe://kruntimes.io/gateway/a/b",
        "https://kruntimes.io/gateway/gw",
        "spiffe://kruntimes.io/control-plane/",
    ],
)
def test_anything_else_is_not_an_identity(uri: str) -> None:
    with pytest.raises(IdentityError):
        Identity.parse(uri)


def test_the_ca_is_created_once_and_kept_private(tmp_path: Path) -> None:
    directory = tmp_path / "pki"
    first = Authority.ensure(directory)
    assert mode(directory) == 0o700 and mode(directory / "ca.key") == 0o600
    again = Authority.ensure(directory)
    assert again.cert_pem == first.cert_pem
    assert again.key.private_numbers() == first.key.private_numbers()
    assert first.cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_a_certificate_names_its_identity_and_where_it_serves(tmp_path: Path) -> None:
    authority = Authority.ensure(tmp_path / "ca")
    issued = authority.write(
        tmp_path / "host",
        HOST,
        lifetime=dt.timedelta(days=30),
        dns_names=("localhost",),
        ip_addresses=("127.0.0.1",),
    )
    assert mode(tmp_path / "host") == 0o700 and mode(tmp_path / "host" / TLS_KEY) == 0o600
    assert (tmp_path / "host" / CA_CERT).read_bytes() == authority.cert_pem
    cert = x509.load_pem_x509_certificate((tmp_path / "host" / TLS_CERT).read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == [HOST.uri]
    assert sans.get_values_for_type(x509.DNSName) == [HOST.dns_name, "host.kruntimes.internal", "localhost"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    usages = list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert usages == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == dt.timedelta(days=30, minutes=1)
    assert cert.not_valid_after_utc == issued.not_after.replace(microsecond=0)
    assert identity_of(cert) == HOST
    cert.verify_directly_issued_by(authority.cert)
    # the control plane serves nothing: its certificate is a client's only
    control = authority.issue(Identity.control_plane("w"))
    usages = list(
        x509.load_pem_x509_certificate(control.cert_pem)
        .extensions.get_extension_for_class(x509.ExtendedKeyUsage)
        .value
    )
    assert usages == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_a_lifetime_out_of_bounds_is_refused(tmp_path: Path) -> None:
    authority = Authority.ensure(tmp_path / "ca")
    for lifetime in (dt.timedelta(0), dt.timedelta(days=398)):
        with pytest.raises(ValueError):
            authority.issue(HOST, lifetime=lifetime)


def test_a_certificate_is_renewed_only_after_two_thirds_of_its_validity(tmp_path: Path) -> None:
    authority = Authority.ensure(tmp_path / "ca")
    directory = tmp_path / "host"
    issued = authority.write(directory, HOST, lifetime=dt.timedelta(days=30), ip_addresses=("127.0.0.1",))
    cert = x509.load_pem_x509_certificate(issued.cert_pem)
    due = renewal_due(cert)
    assert dt.timedelta(days=19) < due - issued.not_before < dt.timedelta(days=21)
    assert authority.renew_if_due(directory, now=due - dt.timedelta(seconds=1)) is None
    assert (directory / TLS_CERT).read_bytes() == issued.cert_pem
    renewed = authority.renew_if_due(directory, now=due)
    assert renewed is not None and renewed.key_pem != issued.key_pem
    new = x509.load_pem_x509_certificate((directory / TLS_CERT).read_bytes())
    assert new.serial_number != cert.serial_number
    assert identity_of(new) == HOST
    same_names = [
        c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value for c in (cert, new)
    ]
    assert same_names[0] == same_names[1]
    assert (
        new.not_valid_after_utc - new.not_valid_before_utc
        == cert.not_valid_after_utc - cert.not_valid_before_utc
    )


def test_identity_of_a_certificate_needs_exactly_one_platform_uri(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    authority = Authority.ensure(tmp_path / "ca")
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)

    def cert(*uris: str) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([]))
            .issuer_name(authority.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + dt.timedelta(hours=1))
        )
        if uris:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris]), critical=False
            )
        return builder.sign(authority.key, hashes.SHA256())

    for bad in (cert(), cert(HOST.uri, Identity.gateway("g").uri), cert("spiffe://other.io/host/a/b")):
        with pytest.raises(IdentityError):
            identity_of(bad)
    assert identity_of(cert(HOST.uri)) == HOST
    assert identity_of_peercert({"subjectAltName": (("URI", HOST.uri), ("DNS", "x"))}) == HOST
    assert identity_of_peercert({"subjectAltName": (("URI", HOST.uri), ("URI", HOST.uri))}) is None
    assert identity_of_peercert({"subjectAltName": (("DNS", HOST.dns_name),)}) is None
    assert identity_of_peercert(None) is None


# -- PeerTLS: a certificate directory that follows its files -------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_directory_is_read_only_for_its_role_and_with_its_own_key(tmp_path: Path) -> None:
    authority = Authority.ensure(tmp_path / "ca")
    authority.write(tmp_path / "host", HOST)
    assert PeerTLS(tmp_path / "host", role=Role.HOST).identity == HOST
    with pytest.raises(PeerTLSError, match="not a gateway"):
        PeerTLS(tmp_path / "host", role=Role.GATEWAY)
    other = authority.issue(HOST)
    (tmp_path / "host" / TLS_KEY).write_bytes(other.key_pem)
    with pytest.raises(PeerTLSError, match="does not belong"):
        PeerTLS(tmp_path / "host", role=Role.HOST)
    with pytest.raises(PeerTLSError, match="cannot read"):
        PeerTLS(tmp_path / "missing", role=Role.HOST)


def test_new_files_are_picked_up_at_the_next_check_and_a_broken_set_is_refused(tmp_path: Path) -> None:
    authority = Authority.ensure(tmp_path / "ca")
    directory = tmp_path / "host"
    authority.write(directory, HOST)
    clock = Clock()
    tls = PeerTLS(directory, role=Role.HOST, check_interval_s=1.0, clock=clock)
    first = tls.serial
    client, server = tls.client_context(), tls.server_context()
    renewed = authority.write(directory, HOST)
    assert not tls.refresh() and tls.serial == first  # looked at once per interval
    clock.now += 1.0
    assert tls.refresh() and tls.generation == 1
    assert tls.serial == x509.load_pem_x509_certificate(renewed.cert_pem).serial_number
    assert tls.client_context() is not client  # a new context for new connections
    assert tls.server_context() is server  # the same, loaded in place
    # a writer between its two renames: a key of another certificate
    (directory / TLS_KEY).write_bytes(authority.issue(HOST).key_pem)
    clock.now += 1.0
    assert not tls.refresh() and tls.generation == 1
    # and a certificate for another identity is refused, not adopted
    authority.write(directory, Identity.host(runtime="python", host_id="python-1"))
    clock.now += 1.0
    assert not tls.refresh() and tls.identity == HOST and tls.generation == 1


def test_channel_options_verify_the_server_by_identity(tmp_path: Path) -> None:
    assert dict(PeerTLS.channel_options(HOST))["grpc.ssl_target_name_override"] == HOST.dns_name
    assert (
        dict(PeerTLS.channel_options(Role.GATEWAY))["grpc.ssl_target_name_override"]
        == "gateway.kruntimes.internal"
    )


def test_key_material_is_loaded_without_being_written_to_disk(tmp_path: Path) -> None:
    """The ssl module loads keys from files only: they are given as anonymous memory files."""
    authority = Authority.ensure(tmp_path / "ca")
    authority.write(tmp_path / "host", HOST)
    before = set(Path("/tmp").iterdir()) if Path("/tmp").exists() else set()
    PeerTLS(tmp_path / "host", role=Role.HOST).client_context()
    after = set(Path("/tmp").iterdir()) if Path("/tmp").exists() else set()
    assert not {p for p in after - before if p.name.startswith("krt-tls-")}
    key = serialization.load_pem_private_key((tmp_path / "host" / TLS_KEY).read_bytes(), password=None)
    assert key is not None
