"""Async invocations through the real gateway and worker (issue #44): accepted, run once per id,
read, waited for, listed by state and resubmitted, on a Run and on a Function. The function counts
its calls in a file the test reads, so "once" is what the function saw, not what the API says."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kruntimes.api.function import Function
from kruntimes.api.run import Run
from kruntimes.sdk.client import (
    Client,
    FunctionNotFound,
    InvocationConflict,
    InvocationNotFound,
    RunObject,
)
from tests.sdk.stack import Platform, manifest, unique
from tests.support.waiting import eventually

# Appends a line to p['log'] for each call, then fails if asked to: the test counts the lines.
COUNTING = (
    "def handle(p):\n"
    "    with open(p['log'], 'a') as f:\n"
    "        f.write('called\\n')\n"
    "    if p.get('fail'):\n"
    "        raise ValueError('asked to fail')\n"
    "    return {'n': p.get('n')}\n"
)


def _calls(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _log(platform: Platform) -> Path:
    exchange = platform.shared / unique("async")  # a directory the function sees too
    exchange.mkdir()
    exchange.chmod(0o1777)
    return exchange / "calls"


async def _ready(krt: Client) -> RunObject:
    name = unique("async")
    await krt.create(Run.from_dict(manifest(name, source=COUNTING)))
    return await krt.wait(name, timeout=60)


async def test_an_invocation_is_accepted_runs_once_per_id_and_keeps_its_answer(
    krt: Client, platform: Platform
) -> None:
    run = await _ready(krt)
    log = _log(platform)
    body = {"log": str(log), "n": 7}
    inv = f"order-{uuid.uuid4().hex[:8]}"
    accepted = await krt.invoke_async(run, body, invocation_id=inv)
    assert accepted.invocationId == inv and accepted.state.value in ("Queued", "Running")
    assert accepted.location.startswith(platform.config.gatewayUrl) and accepted.location.endswith(
        f"/invocations/{inv}"
    )
    done = await krt.invocations.wait(accepted, timeout=60)
    assert done.state.value == "Succeeded" and done.invocationId == inv
    answer = done.answer()
    assert answer is not None and answer.outputs == {"n": 7}
    assert done.attemptCount == 1 and done.endedAt is not None and done.expiresAt is not None
    # the same id and body again, one after the other and twenty at once: the same invocation
    again = await krt.invoke_async(run.metadata.name, body, invocation_id=inv)
    assert again.location == accepted.location
    many = await asyncio.gather(*(krt.invoke_async(run, body, invocation_id=inv) for _ in range(20)))
    assert {a.location for a in many} == {accepted.location}
    assert (await krt.invocations.get(run.metadata.name, inv)).state.value == "Succeeded"
    assert _calls(log) == 1, "the function ran once for one id"
    with pytest.raises(InvocationConflict) as conflict:
        await krt.invoke_async(run, {**body, "n": 8}, invocation_id=inv)
    assert conflict.value.status == 409 and conflict.value.invocation_id == inv
    with pytest.raises(InvocationNotFound):
        await krt.invocations.get(run, f"never-{uuid.uuid4().hex[:8]}")
    assert _calls(log) == 1
    # a new id sent fifty times at once, every submission racing the first: one invocation, one run
    burst_id = f"burst-{uuid.uuid4().hex[:8]}"
    burst = await asyncio.gather(
        *(krt.invoke_async(run, {**body, "n": 9}, invocation_id=burst_id) for _ in range(50))
    )
    assert len({a.location for a in burst}) == 1
    assert (await krt.invocations.wait(burst[0], timeout=60)).state.value == "Succeeded"
    assert _calls(log) == 2, "the fifty submissions of one id ran the function once"


async def test_a_failed_invocation_is_listed_as_failed_and_resubmitted_under_a_new_id(
    krt: Client, platform: Platform
) -> None:
    run = await _ready(krt)
    log = _log(platform)
    ok = await krt.invoke_async(run, {"log": str(log), "n": 1})
    failing = await krt.invoke_async(run, {"log": str(log), "fail": True})
    failed = await krt.invocations.wait(failing, timeout=60)
    assert failed.state.value == "Failed" and failed.error is not None and failed.error.reason
    assert (await krt.invocations.wait(ok, timeout=60)).ok
    dead = [i.invocationId async for i in krt.invocations.list(run, state="Failed")]
    assert dead == [failing.invocationId], "the dead-letter view holds the failed one only"
    every = {i.invocationId async for i in krt.invocations.list(run.metadata.name)}
    assert every == {ok.invocationId, failing.invocationId}
    retried = await krt.invocations.resubmit(run, failing.invocationId, new_id=f"{failing.invocationId}-2")
    assert retried.invocationId == f"{failing.invocationId}-2" and retried.location != failing.location
    assert (await krt.invocations.wait(retried, timeout=60)).state.value == "Failed", (
        "the same body fails again"
    )
    await eventually(lambda: _calls(log) == 3, what="three calls: one each for ok, failing, resubmitted")
    assert (await krt.invocations.get(failing.location)).state.value == "Failed", (
        "the first one is left as it was"
    )


async def test_a_task_run_takes_no_async_invocation(krt: Client) -> None:
    name = unique("task")
    await krt.create(Run.from_dict(manifest(name, mode={"task": {}})))
    with pytest.raises(FunctionNotFound) as refused:
        await krt.invoke_async(name, {})
    assert refused.value.reason == "NotAFunction"


@contextlib.asynccontextmanager
async def _function(krt: Client, name: str) -> AsyncIterator[None]:
    document = manifest(name, source=COUNTING)
    await krt.functions.apply(Function.from_dict({**document, "kind": "Function"}))
    try:
        yield
    finally:
        with contextlib.suppress(FunctionNotFound):
            await krt.functions.delete(name, timeout=120)


async def test_a_function_takes_async_invocations_by_its_name(krt: Client, platform: Platform) -> None:
    name = unique("afn")
    log = _log(platform)
    async with _function(krt, name):
        await krt.functions.wait_ready(name, timeout=90)
        accepted = await krt.invoke_async(name, {"log": str(log), "n": 3}, function=True)
        assert "/namespaces/default/functions/" in accepted.location
        done = await krt.invocations.wait(name, accepted.invocationId, function=True, timeout=60)
        answer = done.answer()
        assert done.ok and answer is not None and answer.outputs == {"n": 3}
        assert done.target.kind == "Function"
        listed = [i.invocationId async for i in krt.invocations.list(name, function=True, state="Succeeded")]
        assert listed == [accepted.invocationId]
        assert _calls(log) == 1
