"""The gateway sessions of callers' tokens (kruntimes.mcp.invokers): one per token, reused while
kept, never one caller's for another, none closed while a call uses it. No network: an Invoker
opens its connection only when it sends."""

from __future__ import annotations

import pytest

from kruntimes.mcp import invokers
from kruntimes.mcp.invokers import Invokers
from kruntimes.sdk.config import ClientConfig

CONFIG = ClientConfig(token="the-servers-own")


async def test_each_token_has_its_own_session_carrying_that_token_and_kept_between_calls() -> None:
    sessions = Invokers(CONFIG)
    async with sessions.of("carol-token") as carol:
        assert carol.config.token == "carol-token"
    async with sessions.of("dave-token") as dave:
        assert dave.config.token == "dave-token" and dave is not carol
    async with sessions.of("carol-token") as again:
        assert again is carol
    await sessions.close()
    async with sessions.of("carol-token") as after_close:
        assert after_close is not carol
    await sessions.close()


async def test_idle_sessions_are_closed_when_a_call_ends_but_never_one_in_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(invokers, "IDLE_S", -1.0)  # every idle session is past its time
    sessions = Invokers(CONFIG)
    async with sessions.of("carol-token") as carol:
        async with sessions.of("dave-token") as dave:
            pass
        async with sessions.of("carol-token") as still:
            assert still is carol, "in use: not closed by another call's end"
        async with sessions.of("dave-token") as new:
            assert new is not dave, "idle past its time: closed"
    await sessions.close()


async def test_beyond_max_idle_the_least_recently_used_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(invokers, "MAX_IDLE", 1)
    sessions = Invokers(CONFIG)
    async with sessions.of("carol-token") as carol:
        pass
    async with sessions.of("dave-token") as dave:
        pass
    async with sessions.of("dave-token") as again:
        assert again is dave
    async with sessions.of("carol-token") as new:
        assert new is not carol
    await sessions.close()
