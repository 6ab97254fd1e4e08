"""The embedded mode's authorization: which users and groups may invoke Runs in which namespaces.

The bindings document (its format, and the `use-secrets` verb hosts check) is
kruntimes.config.bindings; the gateway checks the `invoke` bindings (the default verb):

```yaml
bindings:
  - namespace: team-a        # or "*" for every namespace
    users: [alice]
    groups: [team-a-devs]
```
"""

from __future__ import annotations

from kruntimes.config.bindings import ANY_NAMESPACE, Binding, BindingsError, RoleBindings
from kruntimes.gateway.auth.base import FUNCTIONS, Forbidden, Principal, Resource, Unauthenticated
from kruntimes.gateway.auth.tokens import TokenFile

__all__ = ["ANY_NAMESPACE", "Binding", "BindingsError", "EmbeddedAuthorizer", "RoleBindings"]


class EmbeddedAuthorizer:
    """A static token file says who the caller is; role bindings say where they may invoke."""

    def __init__(self, tokens: TokenFile, bindings: RoleBindings) -> None:
        self._tokens = tokens
        self._bindings = bindings

    async def authorize(self, token: str, resource: Resource) -> Principal:
        principal = self._tokens.principal(token)
        if principal is None:
            raise Unauthenticated("unknown bearer token")
        if not self._bindings.allows(principal, resource.namespace):
            kind = "Functions" if resource.kind == FUNCTIONS else "Runs"
            raise Forbidden(
                f"user {principal.user!r} may not invoke {kind} in namespace {resource.namespace!r}"
            )
        return principal

    async def close(self) -> None:
        return None
