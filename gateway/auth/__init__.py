"""Authentication and authorization of invocations: one Authorizer interface, one auth method per
implementation, registered by name in `methods.METHODS` with its flags (`krt gateway --auth`).

- embedded: `EmbeddedAuthorizer(TokenFile(path), RoleBindings.load(path))`
- kubernetes: `KubernetesAuthorizer(host)` (a SelfSubjectAccessReview with the caller's token)

Either goes behind `CachingAuthorizer`. Their refusals are gateway errors (gateway/errors.py).
`KubernetesAuthorizer` is imported when first named: its Kubernetes client costs the gateway
tens of megabytes of memory, which a gateway with the embedded authorizer does not pay.
"""

from typing import TYPE_CHECKING, Any

from kruntimes.gateway.auth.base import (
    FUNCTIONS,
    RUNS,
    AuthError,
    Authorizer,
    AuthUnavailable,
    Decision,
    Forbidden,
    Principal,
    Resource,
    Unauthenticated,
    bearer_token,
    check_token,
)
from kruntimes.gateway.auth.bindings import Binding, EmbeddedAuthorizer, RoleBindings
from kruntimes.gateway.auth.cache import CacheStats, CachingAuthorizer, cache_key
from kruntimes.gateway.auth.token_expiry import token_expiry
from kruntimes.gateway.auth.tokens import TokenFile, TokenFileError

if TYPE_CHECKING:
    from kruntimes.gateway.auth.kubernetes import KubernetesAuthorizer


def __getattr__(name: str) -> Any:
    if name == "KubernetesAuthorizer":
        from kruntimes.gateway.auth.kubernetes import KubernetesAuthorizer

        return KubernetesAuthorizer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FUNCTIONS",
    "RUNS",
    "AuthError",
    "AuthUnavailable",
    "Authorizer",
    "Binding",
    "CacheStats",
    "CachingAuthorizer",
    "Decision",
    "EmbeddedAuthorizer",
    "Forbidden",
    "KubernetesAuthorizer",
    "Principal",
    "Resource",
    "RoleBindings",
    "TokenFile",
    "TokenFileError",
    "Unauthenticated",
    "bearer_token",
    "cache_key",
    "check_token",
    "token_expiry",
]
