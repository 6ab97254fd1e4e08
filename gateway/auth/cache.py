"""A bounded, short memory of authorization decisions in front of any Authorizer.

An allow (with its Principal) or a Forbidden is remembered for at most `ttl_s` from when it was
asked (however long the inner authorizer took to answer), and never past the token's expiry when
the token is a JWT; a token already expired is never remembered.
Unauthenticated and AuthUnavailable are never remembered. Concurrent misses for the same key
share one inner call. Keys are SHA-256 digests, so the cache holds no token.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from kruntimes.gateway.auth.base import RUNS, Authorizer, Decision, Forbidden, Principal, Resource
from kruntimes.gateway.auth.token_expiry import token_expiry

DEFAULT_TTL_S = 30.0
DEFAULT_MAX_ENTRIES = 10_000


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    coalesced: int = 0  # misses that waited for another caller's in-flight decision


@dataclass(frozen=True)
class _Outcome:
    decision: Decision
    principal: Principal | None = None
    message: str = ""

    def replay(self) -> Principal:
        if self.decision is Decision.ALLOW and self.principal is not None:
            return self.principal
        raise Forbidden(self.message)


def cache_key(token: str, resource: Resource) -> str:
    parts: tuple[str, ...] = (token, resource.namespace, resource.name, resource.run_uid)
    # a Function's decision is its own, and so is each verb's (a Run invocation's key is as it
    # always was)
    if resource.kind != RUNS or resource.verb != "get":
        parts = (*parts, resource.kind)
    if resource.verb != "get":
        parts = (*parts, resource.verb)
    material = "\0".join(parts)
    return hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()


class CachingAuthorizer:
    def __init__(
        self,
        inner: Authorizer,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.time,
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        self._inner = inner
        self._ttl_s = ttl_s
        self._clock = clock  # wall clock: JWT expiries are seconds since the epoch
        self._max_entries = max_entries
        self._entries: OrderedDict[str, tuple[float, _Outcome]] = OrderedDict()
        self._inflight: dict[str, asyncio.Task[_Outcome]] = {}
        self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    async def authorize(self, token: str, resource: Resource) -> Principal:
        if any("\0" in part for part in (token, resource.namespace, resource.name, resource.run_uid)):
            # Keys join the parts with NUL, so a part holding one could pose as another pair of parts.
            return await self._inner.authorize(token, resource)
        key = cache_key(token, resource)
        cached = self._entries.get(key)
        if cached is not None:
            expires_at, outcome = cached
            if self._clock() < expires_at:
                self.stats.hits += 1
                return outcome.replay()
            del self._entries[key]
        self.stats.misses += 1
        task = self._inflight.get(key)
        if task is None:
            # The bound counts from this ask: a slow inner call never stretches what is remembered.
            task = asyncio.create_task(self._decide(key, token, resource, asked=self._clock()))
            self._inflight[key] = task
            task.add_done_callback(lambda done: self._settled(key, done))
        else:
            self.stats.coalesced += 1
        # A caller that gives up does not cancel the decision the others are waiting for.
        outcome = await asyncio.shield(task)
        return outcome.replay()

    async def _decide(self, key: str, token: str, resource: Resource, *, asked: float) -> _Outcome:
        try:
            outcome = _Outcome(Decision.ALLOW, principal=await self._inner.authorize(token, resource))
        except Forbidden as e:
            outcome = _Outcome(Decision.DENY, message=e.message)
        expires_at = asked + self._ttl_s
        expiry = token_expiry(token)
        if expiry is not None:
            expires_at = min(expires_at, expiry)
        if expires_at > self._clock():
            self._remember(key, expires_at, outcome)
        return outcome

    def _remember(self, key: str, expires_at: float, outcome: _Outcome) -> None:
        self._entries.pop(key, None)
        while len(self._entries) >= self._max_entries:
            self._entries.popitem(last=False)
        self._entries[key] = (expires_at, outcome)

    def _settled(self, key: str, task: asyncio.Task[_Outcome]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved here so an error nobody awaited any more is not reported as lost

    async def close(self) -> None:
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._entries.clear()
        await self._inner.close()
