"""The worker's side of async invocations on the shared platform (#44): the InvocationWorkflow
with its real activities (the target read through Temporal, each attempt through the gateway's
GatewayDispatch over mTLS). An invocation that waits behind a busy Run retries only while it did
not run; when its Run is deleted meanwhile, the one that ran is not run again and the one that
waited fails TargetGone."""

from __future__ import annotations

import json
import ssl
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest

from kruntimes.api.run import Run
from kruntimes.contracts.invocation import TERMINAL_STATES
from kruntimes.sdk.client import Client
from kruntimes.wire import headers
from tests.sdk.stack import TOKEN, Platform, manifest, unique
from tests.support.waiting import eventually

ASYNC = {headers.PREFER: "respond-async", headers.AUTHORIZATION: f"Bearer {TOKEN}"}
TERMINAL = {s.value for s in TERMINAL_STATES}
# Records each call, then holds until p['release'] exists (at most 60 s): the first invocation
# keeps the Run's one slot while the test looks.
HOLDING = (
    "import os, time\n"
    "def handle(p):\n"
    "    with open(p['log'], 'a') as f:\n"
    "        f.write(p['n'] + '\\n')\n"
    "    deadline = time.monotonic() + 60\n"
    "    while not os.path.exists(p['release']) and time.monotonic() < deadline:\n"
    "        time.sleep(0.05)\n"
    "    return {'n': p['n']}\n"
)


@pytest.fixture
async def http(platform: Platform) -> AsyncIterator[aiohttp.ClientSession]:
    context = ssl.create_default_context(cafile=str(platform.tls.ca_cert))
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=context), timeout=aiohttp.ClientTimeout(total=60)
    ) as session:
        yield session


async def _post(http: aiohttp.ClientSession, url: str, inv: str, body: dict[str, Any]) -> dict[str, Any]:
    sent = {**ASYNC, headers.INVOCATION_ID: inv}
    async with http.post(url, data=json.dumps(body).encode(), headers=sent) as answer:
        doc: dict[str, Any] = await answer.json()
        assert answer.status == 202, doc
        return doc


async def _get(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url, headers=ASYNC) as answer:
        doc: dict[str, Any] = await answer.json()
        assert answer.status == 200, doc
        return doc


async def test_a_waiting_invocation_of_a_deleted_run_fails_target_gone_and_the_one_that_ran_is_not_rerun(
    platform: Platform, http: aiohttp.ClientSession
) -> None:
    exchange = platform.shared / unique("holding")  # a directory the function sees too
    exchange.mkdir()
    exchange.chmod(0o1777)
    calls, release = exchange / "calls", exchange / "release"
    async_block = {"retry": {"maxAttempts": 100}, "share": 100}
    name = unique("async-gone")
    mode = {"function": {"concurrency": 1, "asyncInvocations": async_block}}
    async with Client(platform.config) as krt:
        await krt.create(Run.from_dict(manifest(name, source=HOLDING, mode=mode)))
        run = await krt.wait(name, timeout=60)
        assert run.status.endpoint is not None
        invoke = run.status.endpoint.url
        collection = invoke.removesuffix(":invoke") + "/invocations"
        first, second = f"first-{uuid.uuid4().hex[:6]}", f"second-{uuid.uuid4().hex[:6]}"
        body = {"log": str(calls), "release": str(release)}
        await _post(http, invoke, first, {**body, "n": "first"})
        await eventually(
            lambda: _get(http, f"{collection}/{first}"),
            until=lambda d: d["state"] == "Running",
            what="first running",
        )
        await eventually(calls.exists, what="the first invocation ran")
        await _post(http, invoke, second, {**body, "n": "second"})
        waiting = await eventually(
            lambda: _get(http, f"{collection}/{second}"),
            until=lambda d: d["attemptCount"] >= 2,
            within=60,
            what="the second invocation retried while the Run is busy",
        )
        assert waiting["state"] in ("Queued", "Running") and waiting["retried"] == "notRun", waiting
        assert not any(a["dispatched"] for a in waiting["attempts"]), waiting
        await krt.delete(name, timeout=60)
    ended = {
        inv: await eventually(
            lambda inv=inv: _get(http, f"{collection}/{inv}"),  # type: ignore[misc]
            until=lambda d: d["state"] in TERMINAL,
            within=90,
            what=f"{inv} ended",
        )
        for inv in (first, second)
    }
    gone = ended[second]
    assert (gone["state"], gone["error"]["reason"]) == ("Failed", "TargetGone"), gone
    assert not any(a["dispatched"] for a in gone["attempts"]), "it never ran"
    ran = ended[first]
    assert ran["attemptCount"] == 1, f"the one that ran was not run again: {ran}"
    assert ran["state"] != "Succeeded" or ran["result"], ran
    assert calls.read_text().splitlines() == ["first"], "the function ran the first invocation only, once"


async def test_an_invocation_id_of_format_characters_and_slashes_runs_and_ends(
    platform: Platform, http: aiohttp.ClientSession
) -> None:
    """An id is any printable ASCII: `%` (which a log line's format takes for its own) and `/` (the
    workflow id's separator) are the caller's characters, never the platform's."""
    name = unique("async-pct")
    async with Client(platform.config) as krt:
        await krt.create(Run.from_dict(manifest(name, source="def handle(p):\n    return {'n': p['n']}\n")))
        run = await krt.wait(name, timeout=60)
        assert run.status.endpoint is not None
        invoke = run.status.endpoint.url
        collection = invoke.removesuffix(":invoke") + "/invocations"
        inv = f"pct%s%d%%-{uuid.uuid4().hex[:6]}/a b?c#"
        await _post(http, invoke, inv, {"n": "1"})
        ended = await eventually(
            lambda: _get(http, f"{collection}/{quote(inv, safe='')}"),
            until=lambda d: d["state"] in TERMINAL,
            within=60,
            what="the invocation ended",
        )
        assert (ended["state"], ended["invocationId"]) == ("Succeeded", inv), ended
        assert json.loads(ended["result"])["outputs"] == {"n": "1"}, ended
        await krt.delete(name, timeout=60)
