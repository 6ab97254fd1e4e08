"""The HTTPS sessions invocations over HTTP reach the gateway in: one per caller's token (the SDK's
Invoker carries one token), kept alive between that caller's calls for a short while, so a
remote agent's invocations do not each pay a TLS handshake; never shared between two tokens.

Keys are SHA-256 digests of the tokens. When a call ends, the sessions nobody used for IDLE_S are
closed, and the least recently used idle ones beyond MAX_IDLE; the rest when the server stops.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from kruntimes.sdk.config import ClientConfig
from kruntimes.sdk.invoke import Invoker

IDLE_S = 60.0
MAX_IDLE = 64


@dataclass
class _Session:
    invoker: Invoker
    users: int = 0
    last: float = 0.0


class Invokers:
    def __init__(self, config: ClientConfig) -> None:
        self._config = config
        self._open: OrderedDict[str, _Session] = OrderedDict()

    @asynccontextmanager
    async def of(self, token: str) -> AsyncIterator[Invoker]:
        """The session of `token`, held open while in use."""
        key = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
        session = self._open.get(key)
        if session is None:
            session = _Session(Invoker(self._config._replace(token=token)))
            self._open[key] = session
        self._open.move_to_end(key)
        session.users += 1
        try:
            yield session.invoker
        finally:
            session.users -= 1
            session.last = time.monotonic()
            await self._trim()

    async def _trim(self) -> None:
        now = time.monotonic()
        idle = [(k, s) for k, s in self._open.items() if s.users == 0]  # least recently used first
        surplus = len(idle) - MAX_IDLE
        # taken out before any await, so a call starting meanwhile makes a new one, never reuses these
        closing = [(k, s) for i, (k, s) in enumerate(idle) if i < surplus or now - s.last > IDLE_S]
        for key, _ in closing:
            del self._open[key]
        for _, session in closing:
            await session.invoker.close()

    async def close(self) -> None:
        sessions, self._open = list(self._open.values()), OrderedDict()
        for session in sessions:
            await session.invoker.close()
