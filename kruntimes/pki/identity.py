"""Platform identities: who a certificate names, as a role and a name.

Every component certificate carries exactly one URI SAN in the platform's trust domain:

    spiffe://kruntimes.io/control-plane/<name>          the worker (Temporal activities)
    spiffe://kruntimes.io/gateway/<name>                a gateway (<name>: its gateway id)
    spiffe://kruntimes.io/host/<runtime>/<host-id>      a runtime host

Each name part is a DNS-1123 label, so an identity also has a DNS name, which its certificate
carries too and which TLS clients verify the server against (grpc's target name override, the
`server_hostname` of an ssl connection):

    <name>.control-plane.kruntimes.internal
    <name>.gateway.kruntimes.internal
    <host-id>.<runtime>.host.kruntimes.internal

and every certificate of a role carries the role's name (`gateway.kruntimes.internal`), for
clients that need some member of a role but not a particular one (a host calling "a gateway").
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from cryptography import x509

from kruntimes.api.names import validate_dns1123_label

TRUST_DOMAIN = "kruntimes.io"
DNS_DOMAIN = "kruntimes.internal"
_PREFIX = f"spiffe://{TRUST_DOMAIN}/"


class IdentityError(ValueError):
    """Not a platform identity: the URI, a name part or the certificate's SANs are wrong."""


class Role(StrEnum):
    CONTROL_PLANE = "control-plane"
    GATEWAY = "gateway"
    HOST = "host"


ANY_ROLE = frozenset(Role)


def role_dns_name(role: Role) -> str:
    """The DNS name every certificate of `role` carries."""
    return f"{role}.{DNS_DOMAIN}"


def _label(value: str, field: str) -> str:
    try:
        return validate_dns1123_label(value, field=field)
    except ValueError as e:
        raise IdentityError(str(e)) from None


@dataclass(frozen=True, slots=True)
class Identity:
    """A role and its name; a host's name is `<runtime>/<host-id>`."""

    role: Role
    name: str

    def __post_init__(self) -> None:
        parts = self.name.split("/")
        if len(parts) != (2 if self.role is Role.HOST else 1):
            expected = "<runtime>/<host-id>" if self.role is Role.HOST else "one DNS-1123 label"
            raise IdentityError(f"a {self.role} identity is named {expected}, not {self.name!r:.80}")
        for part in parts:
            _label(part, f"{self.role} identity")

    @classmethod
    def host(cls, *, runtime: str, host_id: str) -> Identity:
        return cls(Role.HOST, f"{runtime}/{host_id}")

    @classmethod
    def gateway(cls, name: str) -> Identity:
        return cls(Role.GATEWAY, name)

    @classmethod
    def control_plane(cls, name: str) -> Identity:
        return cls(Role.CONTROL_PLANE, name)

    @classmethod
    def parse(cls, uri: str) -> Identity:
        """The identity a URI SAN names; IdentityError if it is not one of the platform's."""
        if not uri.startswith(_PREFIX):
            raise IdentityError(f"{uri!r:.120} is not in the trust domain {TRUST_DOMAIN}")
        role_name, _, name = uri[len(_PREFIX) :].partition("/")
        try:
            role = Role(role_name)
        except ValueError:
            raise IdentityError(f"{uri!r:.120} names no platform role") from None
        return cls(role, name)

    @property
    def uri(self) -> str:
        return f"{_PREFIX}{self.role}/{self.name}"

    @property
    def dns_name(self) -> str:
        labels = ".".join(reversed(self.name.split("/")))
        return f"{labels}.{self.role}.{DNS_DOMAIN}"

    @property
    def runtime(self) -> str:
        """A host's runtime ("" for other roles)."""
        return self.name.split("/")[0] if self.role is Role.HOST else ""

    @property
    def host_id(self) -> str:
        """A host's host id ("" for other roles)."""
        return self.name.split("/")[1] if self.role is Role.HOST else ""

    def __str__(self) -> str:
        return self.uri


def identity_of(cert: x509.Certificate) -> Identity:
    """The identity `cert` names: exactly one URI SAN, a platform identity; else IdentityError."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise IdentityError("the certificate has no subject alternative names") from None
    uris = sans.get_values_for_type(x509.UniformResourceIdentifier)
    if len(uris) != 1:
        raise IdentityError(f"the certificate carries {len(uris)} URI SANs, not exactly one")
    return Identity.parse(uris[0])


def identity_of_peercert(peercert: object) -> Identity | None:
    """The identity in an `ssl` peer certificate dict (`getpeercert()`), or None if it names none:
    exactly one URI SAN, a platform identity."""
    if not isinstance(peercert, dict):
        return None
    uris = [value for kind, value in peercert.get("subjectAltName", ()) if kind == "URI"]
    if len(uris) != 1:
        return None
    try:
        return Identity.parse(uris[0])
    except IdentityError:
        return None
