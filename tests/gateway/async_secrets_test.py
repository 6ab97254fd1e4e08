"""What async invocations keep to themselves (issue #44), on the shared platform's real gateway,
worker and Temporal dev server: the caller's token and the body never in the invocation's Temporal
history (`temporal workflow show`), nor in a log record; a callback URL of the target's spec that
points inside (a loopback address, a name that resolves to one, cloud metadata) is refused by a
worker without `--callback-allow`, which never connects there, and the refusal names neither the
URL's path nor its query; one namespace's full backlog refuses no other namespace's accept."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from kruntimes.api.run import Run
from kruntimes.contracts.invocation import invocation_workflow_id
from kruntimes.gateway.async_invoke import DEFAULT_MAX_BACKLOG, AsyncInvocations
from kruntimes.sdk.client import Client, RunObject
from kruntimes.temporal.devserver import temporal_binary
from kruntimes.wire import headers
from tests.activities.callbacks_test import certs  # noqa: F401 - the receiver's CA, a fixture
from tests.chaos.async_faults_test import HOOK_SECRET, IDENTITY, Receiver, callbacks_allowed, receiver  # noqa: F401
from tests.gateway.async_accept_test import TERMINAL, call, urls
from tests.gateway.conftest import LogCapture
from tests.sdk.stack import OTHER_TOKEN, TOKEN, Platform, manifest, unique
from tests.support.waiting import eventually

ASYNC = {headers.PREFER: "respond-async"}
ECHO = "def handle(p):\n    return {'ok': True}\n"


@pytest.fixture
async def http(platform: Platform) -> AsyncIterator[aiohttp.ClientSession]:
    context = ssl.create_default_context(cafile=str(platform.tls.ca_cert))
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=context), timeout=aiohttp.ClientTimeout(total=60)
    ) as session:
        yield session


async def _run(platform: Platform, name: str, *, namespace: str = "default", **function: Any) -> RunObject:
    async with Client(platform.config) as krt:
        document = manifest(name, source=ECHO, mode={"function": function})
        document["metadata"]["namespace"] = namespace
        await krt.create(Run.from_dict(document))
        return await krt.wait(name, namespace=namespace, timeout=60)


async def _status(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    code, _, doc = await call(http, "GET", url)
    assert code == 200, doc
    assert isinstance(doc, dict)
    return doc


async def _history(platform: Platform, workflow_id: str) -> str:
    """`temporal workflow show --output json` of `workflow_id`, as an operator would print it."""
    proc = await asyncio.create_subprocess_exec(
        temporal_binary(),
        "workflow",
        "show",
        "--address",
        platform.config.temporalAddress,
        "--workflow-id",
        workflow_id,
        "--output",
        "json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_the_token_and_the_body_are_never_in_the_history_the_status_or_a_log(
    platform: Platform, http: aiohttp.ClientSession, log_capture: LogCapture
) -> None:
    run = await _run(platform, unique("sec-hist"))
    uid = run.metadata.uid
    assert uid is not None
    invoke, coll = urls(run)
    marker = f"body-marker-{uuid.uuid4().hex}"
    inv = f"sec-{uuid.uuid4().hex[:6]}"
    body = json.dumps({"password": marker}).encode()
    code, _, doc = await call(http, "POST", invoke, body=body, sent={**ASYNC, headers.INVOCATION_ID: inv})
    assert code == 202, doc
    done = await eventually(
        lambda: _status(http, f"{coll}/{inv}"), within=60, until=lambda d: d["state"] in TERMINAL
    )
    assert done["state"] == "Succeeded", done
    # a resubmit and a refused read too: every path the token takes
    code, _, doc = await call(http, "POST", f"{coll}/{inv}:resubmit", body=b"")
    assert code == 202, doc
    code, _, _ = await call(http, "GET", f"{coll}/{inv}", token=OTHER_TOKEN)
    assert code == 403
    history = await _history(platform, invocation_workflow_id("default", uid, inv))
    assert inv in history, "the show printed the invocation's history"
    for secret in (TOKEN, OTHER_TOKEN, marker):
        assert secret not in history, "a token or the body in plain text in Temporal's history"
        assert secret not in json.dumps(done), "a token or the body in the status"
        assert not [line for line in log_capture.lines if secret in line], "a token or the body in a log"


@pytest.fixture
def frozen(platform: Platform) -> Iterator[AsyncInvocations]:
    """The gateway's backlog counted once from visibility, then by its own accepts."""
    found = platform.gateway.async_invocations
    assert found is not None
    backlog = found.backlog
    saved = backlog.cache_s, backlog.per_namespace
    backlog.cache_s = 3600.0
    backlog._counts.clear()
    try:
        yield found
    finally:
        backlog.cache_s, backlog.per_namespace = saved
        backlog._counts.clear()


async def test_a_namespace_whose_backlog_is_full_refuses_no_other_namespaces_accept(
    platform: Platform, http: aiohttp.ClientSession, frozen: AsyncInvocations
) -> None:
    mine = await _run(platform, unique("sec-full"))
    theirs = await _run(platform, unique("sec-other"), namespace=unique("tenant"))
    backlog = frozen.backlog
    assert backlog.per_namespace == DEFAULT_MAX_BACKLOG

    async def accept(run: RunObject) -> tuple[int, Any]:
        invoke, _ = urls(run)
        inv = f"ns-{uuid.uuid4().hex[:6]}"
        code, _, doc = await call(
            http, "POST", invoke, body=b"{}", sent={**ASYNC, headers.INVOCATION_ID: inv}
        )
        return code, doc

    for _ in range(3):
        code, doc = await accept(mine)
        assert code == 202, doc
    held = backlog._counts[("namespace", "default")]
    backlog.per_namespace = held.count + held.added  # default's namespace now full
    code, doc = await accept(mine)
    assert (code, doc["reason"]) == (429, "AsyncBacklogFull") and "namespace" in doc["message"], doc
    for _ in range(2):  # within the bound, which is per namespace: theirs holds none yet
        code, doc = await accept(theirs)
        assert code == 202, ("another namespace refused for default's backlog", doc)
    code, doc = await accept(mine)
    assert code == 429, doc


class Listener:
    """A TCP port on 127.0.0.1 that counts the connections made to it (and closes them)."""

    def __init__(self) -> None:
        self.connections = 0
        self.port = 0

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.close()


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    made = Listener()
    server = await asyncio.start_server(made._accepted, "127.0.0.1", 0)
    made.port = server.sockets[0].getsockname()[1]
    async with server:
        yield made


async def test_a_callback_to_an_internal_address_is_refused_and_nothing_connects(
    platform: Platform, http: aiohttp.ClientSession, listener: Listener
) -> None:
    query = f"token=hook-secret-{uuid.uuid4().hex}"
    targets = {
        "loopback": f"https://127.0.0.1:{listener.port}/hook/path-secret?{query}",
        "a name of loopback": f"https://localhost:{listener.port}/hook/path-secret?{query}",
        "mapped loopback": f"https://[::ffff:127.0.0.1]:{listener.port}/hook/path-secret?{query}",
        "cloud metadata": f"https://169.254.169.254/latest/meta-data/path-secret?{query}",
    }
    runs = {}
    for what, url in targets.items():
        runs[what] = await _run(platform, unique("sec-cb"), asyncInvocations={"callback": {"url": url}})
    accepted: dict[str, str] = {}
    for what, run in runs.items():
        invoke, coll = urls(run)
        inv = f"cb-{uuid.uuid4().hex[:6]}"
        code, _, doc = await call(
            http, "POST", invoke, body=b"{}", sent={**ASYNC, headers.INVOCATION_ID: inv}
        )
        assert code == 202, doc
        accepted[what] = f"{coll}/{inv}"
    for what, url in accepted.items():
        done = await eventually(
            lambda url=url: _status(http, url),  # type: ignore[misc]
            within=60,
            until=lambda d: d["callback"] is not None and d["callback"]["failures"],
            what=f"the {what} callback tried",
        )
        assert done["state"] == "Succeeded", done
        callback = done["callback"]
        assert not callback["delivered"], (what, callback)
        message = callback["failures"][0]["message"]
        assert message.startswith("refused: "), (what, message)
        assert "path-secret" not in message and "hook-secret" not in message, (what, message)
    assert listener.connections == 0, "a callback connected to an internal address"


async def test_the_status_names_the_callbacks_host_never_its_path_or_query(
    platform: Platform, http: aiohttp.ClientSession, listener: Listener
) -> None:
    secret = f"hook-secret-{uuid.uuid4().hex}"
    url = f"https://127.0.0.1:{listener.port}/hook/{secret}?token={secret}"
    run = await _run(platform, unique("sec-url"), asyncInvocations={"callback": {"url": url}})
    invoke, coll = urls(run)
    inv = f"url-{uuid.uuid4().hex[:6]}"
    code, _, doc = await call(http, "POST", invoke, body=b"{}", sent={**ASYNC, headers.INVOCATION_ID: inv})
    assert code == 202, doc
    done = await eventually(
        lambda: _status(http, f"{coll}/{inv}"),
        within=60,
        until=lambda d: d["callback"] is not None and d["callback"]["failures"],
    )
    assert secret not in json.dumps(done), done["callback"]


async def test_the_callbacks_signing_key_is_never_in_the_status_the_history_or_a_log(
    platform: Platform,
    http: aiohttp.ClientSession,
    receiver: Receiver,  # noqa: F811 - the imported fixture
    callbacks_allowed: bytes,  # noqa: F811 - the imported fixture
    log_capture: LogCapture,
) -> None:
    """A signed callback delivered (the worker allowed 127.0.0.1 and the Secret): its key, in
    any spelling, nowhere but in the signature the receiver checks."""
    receiver.failing = 0
    url = f"https://127.0.0.1:{receiver.port}/hook"
    policy = {"callback": {"url": url, "secretName": HOOK_SECRET}}
    async with Client(platform.config.model_copy(update={"identity": IDENTITY})) as owner:
        name = unique("sec-key")
        await owner.create(
            Run.from_dict(manifest(name, source=ECHO, mode={"function": {"asyncInvocations": policy}}))
        )
        run = await owner.wait(name, timeout=60)
    uid = run.metadata.uid
    assert uid is not None
    invoke, coll = urls(run)
    inv = f"key-{uuid.uuid4().hex[:6]}"
    code, _, doc = await call(http, "POST", invoke, body=b"{}", sent={**ASYNC, headers.INVOCATION_ID: inv})
    assert code == 202, doc
    done = await eventually(
        lambda: _status(http, f"{coll}/{inv}"),
        within=60,
        until=lambda d: d["callback"] is not None and d["callback"]["delivered"],
        what="the signed callback delivered",
    )
    assert len(receiver.requests) == 1
    history = await _history(platform, invocation_workflow_id("default", uid, inv))
    key = callbacks_allowed
    spellings = {key.decode(), key.hex(), base64.b64encode(key).decode()}
    for spelling in spellings:
        assert spelling not in json.dumps(done), "the key in the status"
        assert spelling not in history, "the key in Temporal's history"
        assert not [line for line in log_capture.lines if spelling in line], "the key in a log"
        assert spelling.encode() not in receiver.requests[0][1], "the key in the callback's body"
