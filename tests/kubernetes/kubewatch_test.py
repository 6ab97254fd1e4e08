"""One watch response as kruntimes.system.kubewatch reads it: events one per line whatever the chunks,
an ERROR event raising (410 WatchGone, any other WatchFailed) instead of being handed on, and the
bounds on what is not a watch stream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kruntimes.system.kubewatch import MAX_EVENT_BYTES, WatchFailed, WatchGone, watch_events


class Content:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


class Response:
    """What a kubernetes-asyncio call with _preload_content=False hands back, as far as it is read."""

    def __init__(self, chunks: list[bytes], status: int = 200) -> None:
        self.status = status
        self.content = Content(chunks)
        self.closed = False

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.closed = True


def line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


async def read(response: Response) -> list[str]:
    return [event["type"] async for event in watch_events(response, what="pods")]


POD = {"kind": "Pod", "metadata": {"name": "p", "resourceVersion": "7"}}


async def test_events_are_split_by_line_whatever_the_chunks() -> None:
    stream = line("ADDED", POD) + line("BOOKMARK", POD) + line("DELETED", POD)
    chunks = [stream[i : i + 5] for i in range(0, len(stream), 5)]
    response = Response(chunks)
    assert await read(response) == ["ADDED", "BOOKMARK", "DELETED"]
    assert response.closed


@pytest.mark.parametrize(
    ("status", "error"),
    [
        ({"kind": "Status", "code": 410, "reason": "Expired"}, WatchGone),
        ({"code": 500, "reason": "x"}, WatchFailed),
    ],
)
async def test_an_error_event_raises_after_the_events_before_it(status: dict[str, Any], error: type) -> None:
    seen: list[str] = []
    with pytest.raises(error):
        async for event in watch_events(Response([line("ADDED", POD) + line("ERROR", status)]), what="pods"):
            seen.append(event["type"])
    assert seen == ["ADDED"]


async def test_what_is_not_a_watch_stream_fails() -> None:
    with pytest.raises(WatchGone):
        await read(Response([], status=410))
    with pytest.raises(WatchFailed, match="answered 403"):
        await read(Response([], status=403))
    with pytest.raises(WatchFailed, match="not JSON"):
        await read(Response([b"{nope\n"]))
    with pytest.raises(WatchFailed, match="no object"):
        await read(Response([b'{"type": "ADDED"}\n']))
    with pytest.raises(WatchFailed, match="over"):
        await read(Response([b"x" * (MAX_EVENT_BYTES + 1)]))
