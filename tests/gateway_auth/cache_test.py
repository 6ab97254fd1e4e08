from __future__ import annotations

import asyncio
import dataclasses
import hashlib

import pytest

from kruntimes.gateway.auth import (
    AuthUnavailable,
    CachingAuthorizer,
    Forbidden,
    Principal,
    Resource,
    Unauthenticated,
    cache_key,
)
from tests.gateway_auth.helpers import ALICE, RUN, FakeClock, ScriptedAuthorizer, issue, jwt
from tests.support.waiting import eventually


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def test_an_allow_is_remembered_for_30_seconds(clock: FakeClock) -> None:
    token = issue()
    inner = ScriptedAuthorizer(allowed={token})
    cache = CachingAuthorizer(inner, clock=clock)

    assert await cache.authorize(token, RUN) == ALICE
    clock.advance(29.9)
    assert await cache.authorize(token, RUN) == ALICE
    assert len(inner.calls) == 1
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)

    clock.advance(0.1)
    assert await cache.authorize(token, RUN) == ALICE
    assert len(inner.calls) == 2
    assert (cache.stats.hits, cache.stats.misses) == (1, 2)


async def test_a_forbidden_is_remembered_too(clock: FakeClock) -> None:
    token = issue()
    inner = ScriptedAuthorizer()
    cache = CachingAuthorizer(inner, clock=clock)

    for _ in range(3):
        with pytest.raises(Forbidden, match="team-a/hello"):
            await cache.authorize(token, RUN)
    assert len(inner.calls) == 1

    clock.advance(30)
    with pytest.raises(Forbidden):
        await cache.authorize(token, RUN)
    assert len(inner.calls) == 2


@pytest.mark.parametrize(
    "error",
    [Unauthenticated("unknown token"), AuthUnavailable("API down")],
    ids=["unauthenticated", "unavailable"],
)
async def test_errors_are_never_remembered(clock: FakeClock, error: Exception) -> None:
    token = issue()
    inner = ScriptedAuthorizer(allowed={token}, error=error)
    cache = CachingAuthorizer(inner, clock=clock)

    for _ in range(2):
        with pytest.raises(type(error)):
            await cache.authorize(token, RUN)
    assert len(inner.calls) == 2

    inner.error = None
    assert await cache.authorize(token, RUN) == ALICE, "recovered without waiting out a cached error"


@pytest.mark.parametrize(("expires_in", "remembered_s"), [(10, 10.0), (3600, 30.0)])
async def test_a_token_is_remembered_for_30_seconds_or_until_it_expires_if_sooner(
    clock: FakeClock, expires_in: int, remembered_s: float
) -> None:
    token = jwt(sub="alice", exp=int(clock.now) + expires_in)
    inner = ScriptedAuthorizer(allowed={token})
    cache = CachingAuthorizer(inner, clock=clock)

    await cache.authorize(token, RUN)
    clock.advance(remembered_s - 0.1)
    await cache.authorize(token, RUN)
    assert len(inner.calls) == 1
    clock.advance(0.1)
    await cache.authorize(token, RUN)
    assert len(inner.calls) == 2


async def test_an_expired_token_is_never_remembered_and_the_inner_authorizer_decides(
    clock: FakeClock,
) -> None:
    token = jwt(sub="alice", exp=int(clock.now) - 1)
    inner = ScriptedAuthorizer(allowed={token})
    cache = CachingAuthorizer(inner, clock=clock)

    for _ in range(3):
        await cache.authorize(token, RUN)
    assert len(inner.calls) == 3
    assert len(cache) == 0


@pytest.mark.parametrize(
    "other",
    [
        dataclasses.replace(RUN, run_uid="3f1c0f0e-0000-4000-8000-000000000002"),
        dataclasses.replace(RUN, name="other"),
        dataclasses.replace(RUN, namespace="team-b"),
    ],
    ids=["another-uid", "another-name", "another-namespace"],
)
async def test_a_decision_is_about_one_token_namespace_name_and_uid(
    clock: FakeClock, other: Resource
) -> None:
    token, another_token = issue(), issue()
    inner = ScriptedAuthorizer(allowed={token, another_token})
    cache = CachingAuthorizer(inner, clock=clock)

    await cache.authorize(token, RUN)
    await cache.authorize(token, other)
    await cache.authorize(another_token, RUN)
    assert inner.calls == [RUN, other, RUN]
    assert cache.stats.hits == 0


def test_the_key_is_a_sha256_digest_without_the_token() -> None:
    token = issue()
    key = cache_key(token, RUN)
    expected = hashlib.sha256(f"{token}\0team-a\0hello\0{RUN.run_uid}".encode()).hexdigest()
    assert key == expected
    assert token not in key


async def test_parts_holding_nul_are_never_remembered_so_they_cannot_collide(clock: FakeClock) -> None:
    token = issue()
    inner = ScriptedAuthorizer(allowed={token})
    cache = CachingAuthorizer(inner, clock=clock)

    await cache.authorize(token, Resource("a", "b\0c", "d"))
    await cache.authorize(token, Resource("a\0b", "c", "d"))
    assert len(inner.calls) == 2
    assert len(cache) == 0


async def test_concurrent_misses_share_one_inner_call(clock: FakeClock) -> None:
    token = issue()
    inner = ScriptedAuthorizer(allowed={token})
    inner.gate = asyncio.Event()
    cache = CachingAuthorizer(inner, clock=clock)

    waiting = [asyncio.create_task(cache.authorize(token, RUN)) for _ in range(5)]
    await asyncio.sleep(0)
    inner.gate.set()
    assert await asyncio.gather(*waiting) == [ALICE] * 5
    assert len(inner.calls) == 1
    assert (cache.stats.misses, cache.stats.coalesced) == (5, 4)


async def test_concurrent_misses_share_one_failure_and_do_not_remember_it(clock: FakeClock) -> None:
    token = issue()
    inner = ScriptedAuthorizer(error=AuthUnavailable("API down"))
    inner.gate = asyncio.Event()
    cache = CachingAuthorizer(inner, clock=clock)

    waiting = [asyncio.create_task(cache.authorize(token, RUN)) for _ in range(3)]
    await asyncio.sleep(0)
    inner.gate.set()
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(result, AuthUnavailable) for result in results)
    assert len(inner.calls) == 1

    inner.error = None
    with pytest.raises(Forbidden):
        await cache.authorize(token, RUN)
    assert len(inner.calls) == 2


async def test_a_caller_giving_up_does_not_cancel_the_shared_decision(clock: FakeClock) -> None:
    token = issue()
    inner = ScriptedAuthorizer(allowed={token})
    inner.gate = asyncio.Event()
    cache = CachingAuthorizer(inner, clock=clock)

    impatient = asyncio.create_task(cache.authorize(token, RUN))
    patient = asyncio.create_task(cache.authorize(token, RUN))
    await asyncio.sleep(0)
    impatient.cancel()
    await asyncio.sleep(0)
    inner.gate.set()
    assert await patient == ALICE
    assert impatient.cancelled()
    assert len(inner.calls) == 1
    assert await cache.authorize(token, RUN) == ALICE
    assert cache.stats.hits == 1


async def test_the_memory_is_bounded_and_forgets_the_oldest_first(clock: FakeClock) -> None:
    tokens = [issue() for _ in range(3)]
    inner = ScriptedAuthorizer(allowed=tokens)
    cache = CachingAuthorizer(inner, clock=clock, max_entries=2)

    for token in tokens:
        await cache.authorize(token, RUN)
    assert len(cache) == 2
    await cache.authorize(tokens[2], RUN)
    await cache.authorize(tokens[1], RUN)
    assert len(inner.calls) == 3
    await cache.authorize(tokens[0], RUN)
    assert len(inner.calls) == 4


async def test_closing_closes_the_inner_authorizer(clock: FakeClock) -> None:
    inner = ScriptedAuthorizer()
    cache = CachingAuthorizer(inner, clock=clock)
    await cache.close()
    assert inner.closed


class SlowAuthorizer(ScriptedAuthorizer):
    """Answers as ScriptedAuthorizer does, `takes_s` later on `clock` (a slow SelfSubjectAccessReview)."""

    def __init__(self, clock: FakeClock, *, takes_s: float, allowed: set[str]) -> None:
        super().__init__(allowed=allowed)
        self.clock = clock
        self.takes_s = takes_s

    async def authorize(self, token: str, resource: Resource) -> Principal:
        self.clock.advance(self.takes_s)
        return await super().authorize(token, resource)


async def test_a_slow_answer_is_remembered_30_seconds_from_when_it_was_asked_not_answered(
    clock: FakeClock,
) -> None:
    token = issue()
    inner = SlowAuthorizer(clock, takes_s=20, allowed={token})
    cache = CachingAuthorizer(inner, clock=clock)
    asked = clock()

    assert await cache.authorize(token, RUN) == ALICE
    clock.advance(asked + 29.9 - clock())
    assert await cache.authorize(token, RUN) == ALICE
    assert len(inner.calls) == 1, "remembered until 30 s after the ask"

    clock.advance(asked + 30 - clock())
    assert await cache.authorize(token, RUN) == ALICE
    assert len(inner.calls) == 2, "forgotten 30 s after the ask, though answered only 10 s before"


async def test_an_answer_slower_than_30_seconds_is_never_remembered(clock: FakeClock) -> None:
    token = issue()
    inner = SlowAuthorizer(clock, takes_s=31, allowed={token})
    cache = CachingAuthorizer(inner, clock=clock)

    assert await cache.authorize(token, RUN) == ALICE
    assert (len(cache), len(inner.calls)) == (0, 1)
    assert await cache.authorize(token, RUN) == ALICE
    assert len(inner.calls) == 2


async def test_an_answer_taking_the_whole_30_seconds_is_never_remembered(clock: FakeClock) -> None:
    token = issue()
    inner = SlowAuthorizer(clock, takes_s=30, allowed={token})
    cache = CachingAuthorizer(inner, clock=clock)

    assert await cache.authorize(token, RUN) == ALICE
    assert (len(cache), len(inner.calls)) == (0, 1), "expired as it was answered: nothing held for it"


async def test_every_answer_from_memory_counts_as_a_hit(clock: FakeClock) -> None:
    token = issue()
    cache = CachingAuthorizer(ScriptedAuthorizer(allowed={token}), clock=clock)

    for _ in range(3):
        await cache.authorize(token, RUN)
    assert (cache.stats.hits, cache.stats.misses) == (2, 1)


async def test_parts_holding_nul_are_decided_by_the_inner_authorizer_for_that_very_resource(
    clock: FakeClock,
) -> None:
    token = issue()
    inner = ScriptedAuthorizer(allowed={token})
    cache = CachingAuthorizer(inner, clock=clock)
    odd = Resource("a", "b\0c", "d")

    assert await cache.authorize(token, odd) == ALICE
    assert inner.calls == [odd]


async def test_a_token_that_is_not_valid_utf8_still_has_a_key_of_its_own(clock: FakeClock) -> None:
    """A header decoded with surrogateescape holds lone surrogates: it is remembered like any other."""
    token, other = issue("\udcff"), issue("\udcfe")
    expected = hashlib.sha256(f"{token}\0team-a\0hello\0{RUN.run_uid}".encode("utf-8", "surrogatepass"))
    assert cache_key(token, RUN) == expected.hexdigest()
    assert cache_key(token, RUN) != cache_key(other, RUN)

    inner = ScriptedAuthorizer(allowed={token})
    cache = CachingAuthorizer(inner, clock=clock)
    for _ in range(2):
        assert await cache.authorize(token, RUN) == ALICE
    assert len(inner.calls) == 1


class AnswersNothing(ScriptedAuthorizer):
    """A broken authorizer: returns without a Principal instead of raising."""

    async def authorize(self, token: str, resource: Resource) -> Principal:
        self.calls.append(resource)
        return None  # type: ignore[return-value]


async def test_an_allow_without_a_principal_is_a_forbidden(clock: FakeClock) -> None:
    """Never an allow by default: an inner answer that names nobody is refused, also from memory."""
    token = issue()
    cache = CachingAuthorizer(AnswersNothing(), clock=clock)
    for _ in range(2):
        with pytest.raises(Forbidden):
            await cache.authorize(token, RUN)


class ClosesTracked(ScriptedAuthorizer):
    """Counts the inner calls still running when it is closed."""

    def __init__(self) -> None:
        super().__init__(allowed=())
        self.gate = asyncio.Event()  # never set: every call waits until it is cancelled
        self.running = 0
        self.running_at_close: int | None = None

    async def authorize(self, token: str, resource: Resource) -> Principal:
        self.running += 1
        try:
            return await super().authorize(token, resource)
        finally:
            self.running -= 1

    async def close(self) -> None:
        self.running_at_close = self.running
        await super().close()


async def test_closing_cancels_the_decisions_in_flight_and_waits_for_them_before_closing_the_inner(
    clock: FakeClock,
) -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        inner = ClosesTracked()
        cache = CachingAuthorizer(inner, clock=clock)
        waiting = asyncio.create_task(cache.authorize(issue(), RUN))
        await eventually(lambda: inner.running, what="the decision reached the inner authorizer")

        await cache.close()
        assert (inner.closed, inner.running_at_close) == (True, 0)
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert reported == [], "the cancelled decision is settled without an error reported"
    finally:
        loop.set_exception_handler(previous)
