"""The authorization seam: who is calling, what they want, and why they may not have it.

AuthError
 ├── Unauthenticated    401  Unauthenticated            no, malformed, unknown or rejected token
 ├── Forbidden          403  Forbidden                  caller may not `get` this Run
 └── AuthUnavailable    503  AuthorizationUnavailable   the decision could not be made (never an allow)

Messages are for people and never contain the token.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar, Protocol

MAX_TOKEN_BYTES = 8 * 1024


@dataclass(frozen=True)
class Principal:
    user: str
    uid: str
    groups: tuple[str, ...]


@dataclass(frozen=True)
class Resource:
    """The Run being invoked: what a decision is about."""

    namespace: str
    name: str
    run_uid: str


class Decision(enum.Enum):
    ALLOW = "allow"
    DENY = "deny"


class AuthError(Exception):
    status: ClassVar[int] = 500
    reason: ClassVar[str] = "AuthorizationError"
    retry_after: ClassVar[int | None] = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Unauthenticated(AuthError):
    status = 401
    reason = "Unauthenticated"


class Forbidden(AuthError):
    status = 403
    reason = "Forbidden"


class AuthUnavailable(AuthError):
    status = 503
    reason = "AuthorizationUnavailable"
    retry_after = 1


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
