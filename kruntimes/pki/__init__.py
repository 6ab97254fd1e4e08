"""The platform's PKI: identities, the CA that issues them, and their TLS material.

Every internal hop (worker → host, gateway → host, host → gateway) is mutual TLS with certificates
of the platform CA; servers check the role the hop allows.

    identity   Role, Identity (the URI SAN `spiffe://kruntimes.io/<role>/<name>`), parsing it out
               of a certificate
    authority  Authority: the CA (kept), issuing and renewing short-lived certificates into
               certificate directories (tls.crt, tls.key, ca.crt); AuthorityWatch: a CA
               directory reloaded when it changes
    rotation   Rotation: changing the CA in two phases (publish the next CA in every bundle, then
               sign with it, then drop the old one), kept in the CA directory or a Secret
    issuer     HostIssuer: a host's certificate directory plus the assignment public key
    material   PeerTLS: a certificate directory as grpc credentials and ssl contexts for both
               ends, reloaded when the files change
    grpcauth   PeerAuthorization: which roles may call which method of a grpc server
    builder    the one place X.509 certificates are built (CAs and the certificates they sign)
    cluster    ClusterPki: the platform's Secrets on Kubernetes without cert-manager, through a
               SecretStore (`krt pki init-cluster`: workers/pki.py, its Kubernetes client
               workers/pki_secrets.py)
"""

from kruntimes.pki.authority import (
    BUNDLE,
    CA_CERT,
    CA_KEY,
    DEFAULT_LIFETIME,
    TLS_CERT,
    TLS_KEY,
    Authority,
    AuthorityError,
    AuthorityWatch,
    Issued,
    renewal_due,
)
from kruntimes.pki.grpcauth import PeerAuthorization, authorize, peer_identity
from kruntimes.pki.identity import (
    ANY_ROLE,
    Identity,
    IdentityError,
    Role,
    identity_of,
    identity_of_peercert,
    role_dns_name,
)
from kruntimes.pki.issuer import ASSIGNMENT_PUBLIC_KEY, HostIssuer
from kruntimes.pki.material import PeerTLS, PeerTLSError

__all__ = [
    "ANY_ROLE",
    "ASSIGNMENT_PUBLIC_KEY",
    "BUNDLE",
    "CA_CERT",
    "CA_KEY",
    "DEFAULT_LIFETIME",
    "TLS_CERT",
    "TLS_KEY",
    "Authority",
    "AuthorityError",
    "AuthorityWatch",
    "HostIssuer",
    "Identity",
    "IdentityError",
    "Issued",
    "PeerAuthorization",
    "PeerTLS",
    "PeerTLSError",
    "Role",
    "authorize",
    "identity_of",
    "identity_of_peercert",
    "peer_identity",
    "renewal_due",
    "role_dns_name",
]
