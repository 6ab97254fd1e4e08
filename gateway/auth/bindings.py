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
from dataclasses import dataclass
from pathlib import Path

import yaml

from kruntimes.gateway.auth.base import Forbidden, Principal, Resource, Unauthenticated
from kruntimes.gateway.auth.tokens import TokenFile

ANY_NAMESPACE = "*"


@dataclass(frozen=True, slots=True)
class Binding:
    namespace: str
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()


_BINDING_KEYS = frozenset({"namespace", "users", "groups"})


def _names(value: object, *, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{where}: must be a list of non-empty strings")
    return tuple(value)


def _parse(document: object) -> tuple[Binding, ...]:
    """The bindings of a parsed document; ValueError naming the field that is wrong. (Checked by
    hand: the gateway process does not load pydantic.)"""
    if document is None:
        return ()
    if not isinstance(document, dict):
        raise ValueError("the document must be a mapping with a `bindings` list")
    unknown = sorted(str(k) for k in document if k != "bindings")
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown field (only `bindings`)")
    entries = document.get("bindings", [])
    if entries is None:
        return ()
    if not isinstance(entries, list):
        raise ValueError("bindings: must be a list")
    parsed: list[Binding] = []
    for i, entry in enumerate(entries):
        where = f"bindings[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: must be a mapping")
        extra = sorted(str(k) for k in entry if k not in _BINDING_KEYS)
        if extra:
            raise ValueError(f"{where}.{extra[0]}: unknown field (namespace, users, groups)")
        namespace = entry.get("namespace")
        if not isinstance(namespace, str) or not namespace:
            raise ValueError(f"{where}.namespace: required, a non-empty string")
        parsed.append(
            Binding(
                namespace=namespace,
                users=_names(entry.get("users", []), where=f"{where}.users"),
                groups=_names(entry.get("groups", []), where=f"{where}.groups"),
            )
        )
    return tuple(parsed)


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
            parsed = _parse(document)
        except ValueError as e:
            raise ValueError(f"role bindings are malformed: {e}") from None
        return cls(parsed)

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
