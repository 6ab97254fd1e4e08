"""The embedded mode's authorization: which users and groups may invoke Runs in which namespaces.

```yaml
bindings:
  - namespace: team-a        # or "*" for every namespace
    users: [alice]
    groups: [team-a-devs]
```
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.auth.base import Forbidden, Principal, Resource, Unauthenticated
from gateway.auth.tokens import TokenFile

ANY_NAMESPACE = "*"


class Binding(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str = Field(min_length=1)
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()


class _BindingsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bindings: tuple[Binding, ...] = ()


class RoleBindings:
    def __init__(self, bindings: Iterable[Binding]) -> None:
        self._users: dict[str, set[str]] = {}
        self._groups: dict[str, set[str]] = {}
        for binding in bindings:
            self._users.setdefault(binding.namespace, set()).update(binding.users)
            self._groups.setdefault(binding.namespace, set()).update(binding.groups)

    @classmethod
    def from_yaml(cls, text: str) -> RoleBindings:
        """Parse the bindings document; raises ValueError naming what is wrong."""
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"role bindings are not valid YAML: {e}") from None
        try:
            parsed = _BindingsFile.model_validate(document if document is not None else {})
        except ValidationError as e:
            raise ValueError(f"role bindings are malformed: {e}") from None
        return cls(parsed.bindings)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RoleBindings:
        return cls.from_yaml(Path(path).read_text(encoding="utf-8"))

    def allows(self, principal: Principal, namespace: str) -> bool:
        for bound in (namespace, ANY_NAMESPACE):
            if principal.user in self._users.get(bound, ()):
                return True
            if not self._groups.get(bound, set()).isdisjoint(principal.groups):
                return True
        return False


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
            raise Forbidden(
                f"user {principal.user!r} may not invoke Runs in namespace {resource.namespace!r}"
            )
        return principal

    async def close(self) -> None:
        return None
