"""A Function's autoscaler against the whole platform (the shared one: dev server, worker, gateway,
process hosts): under a load step through the gateway's Function URL (real HTTPS clients, the
SDK's) it scales up, and down once the load is gone; with min 0 it goes to zero once idle, a storm
of `wake` signals starts exactly one replica, and an invocation at zero is answered.

The windows are the smallest the API allows (stableWindowSeconds 6: a panic window of 0.6 s), so
each scaling takes seconds."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from temporalio.api.enums.v1 import EventType

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
        await _admitted_before_started(platform, handle)


def _local_activities(events: list[Any]) -> list[tuple[int, str]]:
    """(event id, activity type) of each local activity the history recorded."""
    found = []
    for ev in events:
        if ev.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
            continue
        if ev.marker_recorded_event_attributes.marker_name != "core_local_activity":
            continue
        details = ev.marker_recorded_event_attributes.details
        found.append((ev.event_id, json.loads(details["data"].payloads[0].data)["activity_type"]))
    return found


async def _admitted_before_started(platform: Platform, handle: Any) -> None:
    """The last replica woken was admitted to its pool in the task that started it, before the
    start (the worker's mailbox holds the pool's answer for it: this platform's pool and Runs
    are served by one process), not after a task woken by the start; it took the answer
    unsignalled."""
    events = [ev async for ev in handle.fetch_history_events()]
    starts = [
        ev for ev in events if ev.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]
    started = starts[-1]
    replica = started.start_child_workflow_execution_initiated_event_attributes.workflow_id
    admissions = [(i, kind) for i, kind in _local_activities(events) if kind.startswith("admit_run")]
    # sent early (an early one not sent is followed by the usual admission after the start)
    assert [kind for i, kind in admissions if i < started.event_id][-1:] == ["admit_run_early"], admissions
    assert not [i for i, kind in admissions if kind == "admit_run" and i > started.event_id], admissions
    signals = [
        ev.workflow_execution_signaled_event_attributes.signal_name
        async for ev in platform.temporal.get_workflow_handle(replica).fetch_history_events()
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    ]
    assert "assigned" not in signals, signals
