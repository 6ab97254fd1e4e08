"""A Function's autoscaler against the whole platform (the shared one: dev server, worker, gateway,
process hosts): under a load step through the gateway's Function URL (real HTTPS clients, the
SDK's) it scales up, and down once the load is gone; with min 0 it goes to zero once idle, a storm
of `wake` signals starts exactly one replica, and an invocation at zero is answered.

The windows are the smallest the API allows (stableWindowSeconds 6: a panic window of 0.6 s), so
each scaling takes seconds."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from kruntimes.api.function import Function, FunctionStatus
from kruntimes.contracts.names import SIGNAL_FUNCTION_WAKE, function_workflow_id
from kruntimes.decisions import autoscale
from kruntimes.sdk.client import Client, FunctionNotFound
from kruntimes.workflows.function import WOKEN
from tests.sdk.stack import Platform, manifest, unique
from tests.support.waiting import eventually

SLEEPS = "import time\ndef handle(p):\n    time.sleep(0.3)\n    return {'ok': p}\n"
QUICK = {"stableWindowSeconds": 6, "scaleDownDelaySeconds": 2, "targetConcurrency": 1}


def function(name: str, **scale: Any) -> Function:
    document = manifest(name, source=SLEEPS, mode={"function": {"concurrency": 1}})
    document["spec"]["scale"] = {**QUICK, **scale}
    return Function.from_dict({**document, "kind": "Function"})


@contextlib.asynccontextmanager
async def applied(krt: Client, fn: Function) -> AsyncIterator[None]:
    await krt.functions.apply(fn)
    try:
        await krt.functions.wait_ready(fn.metadata.name, timeout=90)
        yield
    finally:
        with contextlib.suppress(FunctionNotFound):
            await krt.functions.delete(fn.metadata.name, timeout=120)


async def _status(krt: Client, name: str) -> FunctionStatus:
    return await krt.functions.status(name)


async def test_a_function_scales_up_under_a_load_step_and_down_after_it(platform: Platform) -> None:
    name = unique("auto")
    async with Client(platform.config) as krt, applied(krt, function(name, min=1, max=4)):
        stop = asyncio.Event()
        answered: list[int] = []

        async def client(i: int) -> None:
            n = 0
            while not stop.is_set():
                result = await krt.functions.invoke(name, {"client": i, "n": n}, timeout=60)
                assert result.outputs == {"ok": {"client": i, "n": n}}
                answered.append(i)
                n += 1

        clients = [asyncio.create_task(client(i)) for i in range(4)]
        try:

            async def scaled_up() -> bool:
                status = await _status(krt, name)
                return status.replicas.ready >= 3 and status.lastScale is not None

            await eventually(
                scaled_up, within=60, every=0.25, what="3 or more replicas Ready under 4 clients"
            )
            up = (await _status(krt, name)).lastScale
            assert up is not None and up.wanted > up.previous >= 1
            assert up.reason in (autoscale.PANIC_UP, autoscale.SCALE_UP, autoscale.BOUND_MAX), up
            assert f"{up.previous} -> {up.wanted} replicas" in up.message
        finally:
            stop.set()
            await asyncio.gather(*clients)  # every invocation answered 200 (invoke raises otherwise)
        assert set(answered) == {0, 1, 2, 3}

        async def scaled_down() -> bool:
            status = await _status(krt, name)
            return status.replicas.wanted == 1 and status.replicas.total == 1

        await eventually(scaled_down, within=60, every=0.25, what="back to one replica once idle")
        down = (await _status(krt, name)).lastScale
        assert down is not None and down.wanted < down.previous
        assert down.reason in (autoscale.SCALE_DOWN, autoscale.BOUND_MIN), down

        # each change is in the workflow's history: the activity's result that decided it
        handle = platform.temporal.get_workflow_handle(function_workflow_id("default", name))  # type: ignore[arg-type]
        activities = [
            e.activity_task_scheduled_event_attributes.activity_type.name
            async for e in handle.fetch_history_events()
            if e.HasField("activity_task_scheduled_event_attributes")
        ]
        assert "autoscale_function" in activities


async def test_a_function_with_min_zero_idles_to_zero_wakes_once_and_answers_from_zero(
    platform: Platform,
) -> None:
    name = unique("zero")
    async with Client(platform.config) as krt, applied(krt, function(name, min=0, max=2)):

        async def at_zero() -> bool:
            status = await _status(krt, name)
            return status.replicas.wanted == 0 and status.replicas.total == 0

        await eventually(at_zero, within=60, every=0.25, what="no replica once idle")
        last = (await _status(krt, name)).lastScale
        assert last is not None and (last.previous, last.wanted, last.reason) == (1, 0, autoscale.TO_ZERO)

        # a storm of wake signals: exactly one replica, at once
        handle = platform.temporal.get_workflow_handle(function_workflow_id("default", name))  # type: ignore[arg-type]
        await asyncio.gather(*(handle.signal(SIGNAL_FUNCTION_WAKE) for _ in range(20)))

        async def one_replica() -> bool:
            status = await _status(krt, name)
            return status.replicas.ready == 1

        await eventually(one_replica, within=60, every=0.1, what="one replica after the wakes")
        status = await _status(krt, name)
        assert status.replicas.wanted == 1 and status.replicas.total == 1
        assert status.lastScale is not None and status.lastScale.reason == WOKEN
        assert len(await krt.functions.replicas(name)) == 1

        # idle again, to zero; then an invocation through the gateway is held and answered
        await eventually(at_zero, within=60, every=0.25, what="no replica once idle again")
        result = await krt.functions.invoke(name, {"from": "zero"}, timeout=90)
        assert result.outputs == {"ok": {"from": "zero"}}
        status = await _status(krt, name)
        assert status.lastScale is not None and status.lastScale.previous == 0 and status.replicas.wanted >= 1
