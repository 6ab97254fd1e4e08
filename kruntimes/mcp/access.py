"""Who calls a tool, and whether they may.

Over stdio the caller is the local user, with the CLI's authority (client.json or KRT_*: the
same credentials `krt` uses). Over HTTP each request carries a bearer token, checked by an
`Authorize` the entry point builds from the gateway's auth methods (kruntimes.workers.mcp), so a
token may do here exactly what it may at the gateway: a run tool needs the Run's namespace
binding (in a cluster: `get` on that Run, runs.kruntimes.io), a Function tool the Function's
(`get` on functions.kruntimes.io); a host tool needs a binding on every namespace (the admin's,
`*`). The token itself goes on with the call where the gateway checks it again (invoke), so the
gateway, not this server, decides whether the caller may invoke.
"""

from __future__ import annotations

import getpass
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from kruntimes.api.names import validate_subject

EVERY_NAMESPACE = "*"
Kind = Literal["runs", "functions"]  # the resource of group kruntimes.io an access review names
RUNS: Kind = "runs"
FUNCTIONS: Kind = "functions"


@dataclass(frozen=True)
class Target:
    """What a call acts on, as the access review names it: a Run or a Function (`kind`, the
    resource of group kruntimes.io) `name` in `namespace`; `name` "" is the namespace as a whole
    (a listing), EVERY_NAMESPACE every namespace (an admin action)."""

    namespace: str
    name: str = ""
    kind: Kind = RUNS
    # what the tool does to it, as a Kubernetes verb (a cluster's access review asks for each)
    verbs: tuple[str, ...] = ("get",)


@dataclass(frozen=True)
class Caller:
    """Who asked: `name` goes into the audit records (a host action's requestedBy, the log);
    `identity` is the creator the Runs it creates record (None: they get no secret); `token` the
    bearer token an invocation carries to the gateway (None: the server's own config's, stdio)."""

    name: str
    identity: str | None
    token: str | None = field(default=None, repr=False)


class Access(Protocol):
    # a caller's paths are on another machine: a Run's source.path is refused, inline only
    remote: bool

    async def caller(self, request: Any, target: Target) -> Caller:
        """Who asks for `target`; raises a ToolError (Unauthenticated, Forbidden) when they may
        not."""
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

    async def caller(self, request: Any, target: Target) -> Caller:
        return self._caller


# (Authorization header, target) -> (the user, the bearer token); raises ToolError when refused
Authorize = Callable[[str | None, Target], Awaitable[tuple[str, str]]]


class TokenAccess:
    """HTTP: each request's bearer token, checked by `authorize` for the target asked."""

    remote = True

    def __init__(self, authorize: Authorize) -> None:
        self._authorize = authorize

    async def caller(self, request: Any, target: Target) -> Caller:
        header = request.headers.get("authorization") if request is not None else None
        user, token = await self._authorize(header, target)
        try:
            identity: str | None = validate_subject(user, field="user")
        except ValueError:
            identity = None  # a user name no Run may record as its creator: its Runs get no secret
        return Caller(name=f"mcp:{user}", identity=identity, token=token)
