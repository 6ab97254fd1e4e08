"""The authorization seam: who is calling, what they want, and why they may not have it.

The refusals (AuthError: Unauthenticated 401, Forbidden 403, AuthUnavailable 503, never an
allow) are gateway errors, drawn with the rest of the tree in gateway/errors.py and re-exported
here. Messages are for people and never contain the token.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from kruntimes.gateway.errors import AuthError, AuthUnavailable, Forbidden, Unauthenticated

MAX_TOKEN_BYTES = 8 * 1024


class AuthConfigError(Exception):
    """An auth method cannot be used with the flags given (one line, naming the flag)."""


@dataclass(frozen=True)
class Principal:
    user: str
    uid: str
    groups: tuple[str, ...]


RUNS = "runs"
FUNCTIONS = "functions"


@dataclass(frozen=True)
class Resource:
    """The Run (or Function: `kind` FUNCTIONS, `run_uid` the Function's uid) being invoked: what a
    decision is about. A binding for a namespace covers both kinds."""

    namespace: str
    name: str
    run_uid: str
    kind: str = RUNS  # the Kubernetes resource (group kruntimes.io) a review asks about
    # what the caller would do to it, as a Kubernetes verb: `get` is an invocation; the MCP
    # server's tools ask for what they do (create, update, delete, list). Token-file bindings
    # grant a namespace whole, so only a cluster's access review tells the verbs apart.
    verb: str = "get"


class Decision(enum.Enum):
    ALLOW = "allow"
    DENY = "deny"


class Authorizer(Protocol):
    async def authorize(self, token: str, resource: Resource) -> Principal:
        """Return who the caller is if they may invoke `resource`; raise an AuthError otherwise."""
        ...

    async def close(self) -> None: ...


def check_token(token: str) -> str:
    """Return `token` if it is one printable-ASCII word of at most 8 KiB; raise Unauthenticated otherwise."""
    if not token:
        raise Unauthenticated("empty bearer token")
    if len(token) > MAX_TOKEN_BYTES:
        raise Unauthenticated("bearer token too long")
    if not all("\x21" <= ch <= "\x7e" for ch in token):
        raise Unauthenticated("bearer token contains whitespace, control or non-ASCII characters")
    return token


def bearer_token(header: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header value."""
    if header is None or not header.strip():
        raise Unauthenticated("missing bearer token")
    if len(header) > MAX_TOKEN_BYTES + len("Bearer "):
        raise Unauthenticated("Authorization header too long")
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise Unauthenticated("Authorization header is not a bearer token")
    return check_token(token)


__all__ = [
    "MAX_TOKEN_BYTES",
    "AuthConfigError",
    "AuthError",
    "AuthUnavailable",
    "Authorizer",
    "FUNCTIONS",
    "RUNS",
    "Decision",
    "Forbidden",
    "Principal",
    "Resource",
    "Unauthenticated",
    "bearer_token",
    "check_token",
]
