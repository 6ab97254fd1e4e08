"""Invocations through the real gateway: answers and each typed error, never retried."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from kruntimes.api.run import Run
from kruntimes.contracts.names import invoke_url
from kruntimes.sdk.client import (
    Busy,
    Client,
    FunctionNotFound,
    InvocationFailed,
    OutcomeUnknown,
    PayloadRejected,
    RunObject,
    Unauthorized,
)
from tests.sdk.stack import FAILING, OTHER_TOKEN, RUNTIME, SLEEPY, TASK, Platform, manifest, unique
from tests.support.waiting import eventually

# Touches p['started'], then runs until p['release'] exists (at most 60 s): the test decides when
# the invocation ends, and knows when it has begun.
GATED = (
    "import pathlib, time\n"
    "def handle(p):\n"
    "    pathlib.Path(p['started']).touch()\n"
    "    release, deadline = pathlib.Path(p['release']), time.monotonic() + 60\n"
    "    while not release.exists() and time.monotonic() < deadline:\n"
    "        time.sleep(0.01)\n"
    "    return {'released': release.exists()}\n"
)


async def _ready(krt: Client, source: str) -> RunObject:
    name = unique("fn")
    await krt.create(Run.from_dict(manifest(name, source=source)))
    return await krt.wait(name, timeout=60)


async def test_invoke_takes_a_name_a_run_or_its_url_and_echoes_the_invocation_id(krt: Client) -> None:
    run = await _ready(krt, SLEEPY)
    assert run.status.endpoint is not None
    for target in (run.metadata.name, run, run.status.endpoint.url):
        answer = await krt.invoke(target, {"sleep": 0}, invocation_id="my-id-1")
        assert answer.outputs == {"slept": 0} and answer.invocationId == "my-id-1"
    assert (await krt.invoke(run, b'{"sleep": 0}')).ok, "bytes go as they are"


async def test_a_second_concurrent_invocation_is_busy_with_retry_after(
    krt: Client, platform: Platform
) -> None:
    run = await _ready(krt, GATED)
    exchange = platform.shared / unique("busy")  # a directory the function sees too
    exchange.mkdir()
    exchange.chmod(0o1777)
    started, release = exchange / "started", exchange / "release"
    first = asyncio.create_task(krt.invoke(run, {"started": str(started), "release": str(release)}))
    try:
        await eventually(
            lambda: started.exists() or first.done(), within=30, what="the first invocation to run"
        )
        assert not first.done(), f"the first invocation ended before the second was sent: {first}"
        with pytest.raises(Busy) as busy:
            await krt.invoke(run, {})
    finally:
        release.touch()
    assert busy.value.status == 429 and busy.value.retry_after > 0 and busy.value.invocation_id
    assert (await first).outputs == {"released": True}


async def test_an_unknown_function_is_not_found(krt: Client, platform: Platform) -> None:
    url = invoke_url(
        platform.config.gatewayUrl, namespace="default", runtime=RUNTIME, run_uid=str(uuid.uuid4())
    )
    with pytest.raises(FunctionNotFound) as missing:
        await krt.invoke(url, {})
    assert missing.value.status == 404


async def test_a_bad_token_is_unauthorized_and_a_foreign_one_forbidden(platform: Platform) -> None:
    async with Client(platform.config) as krt:
        run = await _ready(krt, SLEEPY)
    for token, status in (("not-a-token", 401), (OTHER_TOKEN, 403)):
        async with Client(platform.config.model_copy(update={"token": token})) as other:
            with pytest.raises(Unauthorized) as refused:
                await other.invoke(run, {"sleep": 0})
        assert refused.value.status == status


async def test_an_invocation_past_its_timeout_is_outcome_unknown(krt: Client) -> None:
    run = await _ready(krt, SLEEPY)
    with pytest.raises(OutcomeUnknown) as unknown:
        await krt.invoke(run, {"sleep": 5}, timeout=0.5, invocation_id="slow-1")
    assert unknown.value.status == 504 and unknown.value.invocation_id == "slow-1"


async def test_a_raising_handler_is_invocation_failed_with_its_output(krt: Client) -> None:
    run = await _ready(krt, FAILING)
    with pytest.raises(InvocationFailed) as failed:
        await krt.invoke(run, {})
    result = failed.value.result
    assert result.status == "HandlerError" and result.error and "boom" in str(result.error)
    assert "about to fail" in result.stdout.data + result.stderr.data


async def test_a_rejected_request_is_payload_rejected(krt: Client) -> None:
    run = await _ready(krt, SLEEPY)
    with pytest.raises(PayloadRejected) as too_long:
        await krt.invoke(run, {}, invocation_id="x" * 200)
    assert too_long.value.status == 400
    with pytest.raises(PayloadRejected) as too_big:
        await krt.invoke(run, {"blob": "x" * (1024 * 1024)})
    assert too_big.value.status == 413


async def test_a_task_run_cannot_be_invoked(krt: Client) -> None:
    name = unique("job")
    await krt.create(Run.from_dict(manifest(name, source=TASK, mode={"task": {}})))
    with pytest.raises(FunctionNotFound, match="is a task"):
        await krt.invoke(name, {})
