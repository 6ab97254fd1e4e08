"""Who calls a tool, and whether they may.

Over stdio the caller is the local user, with the CLI's authority (client.json or KRT_*: the
same credentials `krt` uses). Over HTTP each request carries a bearer token, checked by an
`Authorize` the entry point builds from the gateway's auth methods (kruntimes.workers.mcp), so a
token may do here exactly what it may at the gateway: a run tool needs the Run's namespace
binding; a host tool needs a binding on every namespace (the admin's, `*`).
"""

from __future__ import annotations

import getpass
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kruntimes.api.names import validate_subject

EVERY_NAMESPACE = "*"


@dataclass(frozen=True)
class Caller:
    """Who asked: `name` goes into the audit records (a host action's requestedBy, the log);
    `identity` is the creator the Runs it creates record (None: they get no secret)."""

    name: str
    identity: str | None


class Access(Protocol):
    # a caller's paths are on another machine: a Run's source.path is refused, inline only
    remote: bool

    async def caller(self, request: Any, namespace: str) -> Caller:
        """Who asks for something in `namespace` (EVERY_NAMESPACE: an admin action); raises a
        ToolError (Unauthenticated, Forbidden) when they may not."""
        ...


def local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


class LocalAccess:
    """stdio: the local user, who could run `krt` with the same client config."""

    remote = False

    def __init__(self, identity: str | None) -> None:
        self._caller = Caller(name=f"mcp:{local_user() or 'local'}", identity=identity)

    async def caller(self, request: Any, namespace: str) -> Caller:
        return self._caller


# (Authorization header, namespace) -> (user, groups); raises ToolError when refused
Authorize = Callable[[str | None, str], Awaitable[str]]


class TokenAccess:
    """HTTP: each request's bearer token, checked by `authorize` for the namespace asked."""

    remote = True

    def __init__(self, authorize: Authorize) -> None:
        self._authorize = authorize

    async def caller(self, request: Any, namespace: str) -> Caller:
        header = request.headers.get("authorization") if request is not None else None
        user = await self._authorize(header, namespace)
        try:
            identity: str | None = validate_subject(user, field="user")
        except ValueError:
            identity = None  # a user name no Run may record as its creator: its Runs get no secret
        return Caller(name=f"mcp:{user}", identity=identity)
