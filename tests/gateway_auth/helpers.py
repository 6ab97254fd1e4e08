"""Tokens, clocks and stand-in authorizers for the kruntimes.gateway.auth tests.

Every token a test makes comes from `issue` (or `jwt`), so the log check in conftest can look
for all of them.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import uuid
from collections.abc import Iterable
from pathlib import Path

from kruntimes.gateway.auth import Forbidden, Principal, Resource

ISSUED: set[str] = set()


def issue(label: str = "tok") -> str:
    token = f"{label}-{uuid.uuid4().hex}"
    ISSUED.add(token)
    return token


def jwt(**claims: object) -> str:
    def segment(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    token = f"{segment({'alg': 'RS256', 'kid': uuid.uuid4().hex})}.{segment(claims)}.c2lnbmF0dXJl"
    ISSUED.add(token)
    return token


def write_file(path: Path, text: str, *, mode: int = 0o600) -> Path:
    """Replace `path` atomically (a new inode), as a Secret volume update does."""
    staged = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    staged.write_text(text, encoding="utf-8")
    os.chmod(staged, mode)
    os.replace(staged, path)
    return path


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


RUN = Resource(namespace="team-a", name="hello", run_uid="3f1c0f0e-0000-4000-8000-000000000001")
ALICE = Principal(user="alice", uid="u-1", groups=("devs",))


class ScriptedAuthorizer:
    """Allows the tokens in `allowed`, forbids the rest, or raises `error`; can hold calls at a gate."""

    def __init__(self, *, allowed: Iterable[str] = (), error: Exception | None = None) -> None:
        self.allowed = set(allowed)
        self.error = error
        self.calls: list[Resource] = []
        self.gate: asyncio.Event | None = None
        self.closed = False

    async def authorize(self, token: str, resource: Resource) -> Principal:
        self.calls.append(resource)
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        if token in self.allowed:
            return ALICE
        raise Forbidden(f"no access to {resource.namespace}/{resource.name}")

    async def close(self) -> None:
        self.closed = True
