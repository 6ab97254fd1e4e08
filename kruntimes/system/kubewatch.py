"""A Kubernetes watch stream as the platform's watches read it (host pods, FunctionConfigs): the
options of the watch request, and the events of one response, each bounded in size.

The caller makes the call with its own client (``watch_options`` are the keyword arguments of a
kubernetes-asyncio ``list_*`` call) and hands the raw response to ``watch_events``; this module
never imports the Kubernetes client. ``WatchGone`` means relist (410: the resourceVersion is too
old); ``WatchFailed`` means the stream is unusable (an error status or ERROR event, an event that is
not JSON, has no object, or is over ``MAX_EVENT_BYTES``). A 410 either way, as the answer's status
or as an ERROR event in the stream, is ``WatchGone``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

__all__ = ["MAX_EVENT_BYTES", "WatchFailed", "WatchGone", "watch_events", "watch_options"]

MAX_EVENT_BYTES = 2 * 1024 * 1024


class WatchGone(Exception):
    """The resourceVersion is too old to watch from: relist."""


class WatchFailed(Exception):
    """The API answered with an error or something that is not a watch stream."""


def watch_options(*, watch_seconds: float, resource_version: str | None) -> dict[str, Any]:
    """The keyword arguments of a watch through a kubernetes-asyncio list call, raw response."""
    options: dict[str, Any] = {
        # "true", not True: the client would send "True", which some API emulators ignore.
        "watch": "true",
        "allow_watch_bookmarks": True,
        "timeout_seconds": watch_seconds,
        "_preload_content": False,
        # The server ends the watch after timeout_seconds; this bounds a server that does not.
        "_request_timeout": aiohttp.ClientTimeout(total=watch_seconds + 30, sock_connect=10),
    }
    if resource_version is not None:
        options["resource_version"] = resource_version
    return options


async def watch_events(response: Any, *, what: str) -> AsyncIterator[dict[str, Any]]:
    """The events of one watch response (`what` names the resource in errors), until it ends;
    an ERROR event raises (WatchGone for 410, else WatchFailed), so only ADDED, MODIFIED,
    DELETED and BOOKMARK events are yielded."""
    async with response:
        if response.status == 410:
            raise WatchGone("the watch's resourceVersion is gone")
        if not 200 <= response.status < 300:
            raise WatchFailed(f"watching {what}: the API answered {response.status}")
        buffer = b""
        async for chunk in response.content.iter_any():
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    yield _event(line)
            if len(buffer) > MAX_EVENT_BYTES:
                raise WatchFailed(f"a watch event is over {MAX_EVENT_BYTES} bytes")
        if buffer.strip():
            yield _event(buffer)


def _event(line: bytes) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except ValueError as e:
        raise WatchFailed("a watch event is not JSON") from e
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        raise WatchFailed("a watch event has no object")
    if event.get("type") == "ERROR":
        status = event["object"]
        if status.get("code") == 410:
            raise WatchGone("the watch's resourceVersion is gone")
        raise WatchFailed(f"the watch sent an error: {status.get('code')} {status.get('reason')}")
    return event
