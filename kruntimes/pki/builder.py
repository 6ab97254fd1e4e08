"""X.509 certificates built with `cryptography`: a self-signed CA, and certificates it signs.

The one place certificates are made (the platform CA and its component certificates, the
embedded gateway's serving certificate, the assignment key's certificate, test PKIs). Keys are
ECDSA P-256 unless one is given; signatures SHA-256. A CA carries BasicConstraints(ca, path
length 0), KeyUsage(digital signature, certificate and CRL signing) and its subject key
identifier; a certificate it signs carries BasicConstraints(not a CA), KeyUsage(digital
signature), the extended key usages asked for, its subject alternative names and the CA's key
identifier."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import NameOID

MAX_COMMON_NAME = 64  # characters (RFC 5280's upper bound)


def name(common_name: str, *, organization: str | None = "kruntimes") -> x509.Name:
    """A subject: an organization (None: none) and a common name cut to 64 characters."""
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization)] if organization else []
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name[:MAX_COMMON_NAME]))
    return x509.Name(attributes)


def key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=ca,
        crl_sign=ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _builder(
    subject: x509.Name,
    *,
    issuer: x509.Name,
    public_key: CertificatePublicKeyTypes,
    validity: tuple[dt.datetime, dt.datetime],
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity[0])
        .not_valid_after(validity[1])
    )


def build_ca(
    subject: x509.Name,
    *,
    not_before: dt.datetime,
    not_after: dt.datetime,
    key: ec.EllipticCurvePrivateKey | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA certificate for `subject` and its key (a new one unless given)."""
    key = key or new_key()
    validity = (not_before, not_after)
    cert = (
        _builder(subject, issuer=subject, public_key=key.public_key(), validity=validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def build_leaf(
    subject: x509.Name,
    *,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    sans: Sequence[x509.GeneralName],
    usages: Sequence[x509.ObjectIdentifier],
    not_before: dt.datetime,
    not_after: dt.datetime,
    key: ec.EllipticCurvePrivateKey | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A certificate for `subject` signed by the CA, with these names and extended key usages, and
    its key (a new one unless given)."""
    key = key or new_key()
    authority_key_id = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    validity = (not_before, not_after)
    cert = (
        _builder(subject, issuer=ca_cert.subject, public_key=key.public_key(), validity=validity)
        .add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        .add_extension(key_usage(ca=False), critical=True)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(authority_key_id, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def build_key_certificate(
    subject: x509.Name, *, key: Ed25519PrivateKey, not_before: dt.datetime, not_after: dt.datetime
) -> x509.Certificate:
    """A self-signed certificate that only stands for an Ed25519 key (not a CA, no TLS usage): how
    a key is handed to those who verify with it."""
    validity = (not_before, not_after)
    return (
        _builder(subject, issuer=subject, public_key=key.public_key(), validity=validity)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, None)
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """The key as unencrypted PKCS#8 PEM."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
