"""The pool's next look without a signal is one timer (workflows/pool.py): kept
while the time it rings for stays, moved only when that time comes earlier — not a timer started
and cancelled in every task of a burst of creates."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle

from kruntimes.activities.hosts.process import stop_all
from kruntimes.api.phases import RunPhase
from kruntimes.contracts.names import SIGNAL_CANCEL, pool_workflow_id
from tests.workflows.conftest import Platform, run_manifest


async def _pool_events(platform: Platform) -> tuple[Counter[int], list[Any]]:
    """The event types of the pool's current run, and its events."""
    pool = platform.client.get_workflow_handle(pool_workflow_id(platform.runtime()))
    events = [e async for e in pool.fetch_history_events()]
    return Counter(e.event_type for e in events), events


async def _stop(platform: Platform, handles: list[WorkflowHandle[Any, Any]]) -> None:
    for h in handles:
        with contextlib.suppress(Exception):
            await h.terminate("test finished")
    await stop_all(platform.state_dir)


async def test_a_burst_of_creates_leaves_the_pools_timer_alone(platform_factory) -> None:
    """30 Runs created at once: the pool decides them in many tasks, and its one timer (the next
    probe, every second here) is started once per probe and never cancelled; the probes still come."""
    async with platform_factory(python={"runs": 30, "maxHosts": 1, "minHosts": 1}) as platform:
        handles: list[WorkflowHandle[Any, Any]] = []
        try:
            runtime = platform.runtime()
            handles = await asyncio.gather(
                *(platform.start(run_manifest(f"alarm-{i}", runtime=runtime), by_sdk=True) for i in range(30))
            )
            await asyncio.gather(*(platform.wait_phase(h, RunPhase.Ready, timeout=120) for h in handles))
            first, _ = await _pool_events(platform)

            async def probed_again() -> bool:  # the alarm still rings on its own
                now, _ = await _pool_events(platform)
                return now[EventType.EVENT_TYPE_TIMER_FIRED] >= first[EventType.EVENT_TYPE_TIMER_FIRED] + 2

            await platform.eventually(probed_again, what="two more probes of the pool's hosts")
            types, _ = await _pool_events(platform)
            tasks = types[EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]
            started = types[EventType.EVENT_TYPE_TIMER_STARTED]
            fired = types[EventType.EVENT_TYPE_TIMER_FIRED]
            assert types[EventType.EVENT_TYPE_TIMER_CANCELED] == 0, "a probe's time never moves earlier"
            assert started <= fired + 1, f"{started} timers started, {fired} fired: one waits at most"
            assert tasks > started, f"{tasks} tasks, {started} timers"
        finally:
            await _stop(platform, handles)


async def test_a_scale_in_due_before_the_next_probe_moves_the_timer_earlier(platform_factory) -> None:
    """Probes an hour apart, an idle host due for scale-in after a second: the alarm set for the
    probe is cancelled and set again for the scale-in, and the host goes within seconds."""
    async with platform_factory(
        probe_s=3600.0, python={"minHosts": 0, "scaleInDelaySeconds": 1.0}
    ) as platform:
        handles: list[WorkflowHandle[Any, Any]] = []
        try:
            handles = [await platform.start(run_manifest("alarm-idle", runtime=platform.runtime()))]
            await platform.wait_phase(handles[0], RunPhase.Ready, timeout=120)
            assert len((await platform.pool()).hosts) == 1
            await handles[0].signal(SIGNAL_CANCEL)
            await platform.wait_phase(handles[0], RunPhase.Cancelled)

            async def scaled_in() -> bool:
                return not (await platform.pool()).hosts

            await platform.eventually(scaled_in, timeout=60, what="the idle host scaled in")
            types, _ = await _pool_events(platform)
            assert types[EventType.EVENT_TYPE_TIMER_CANCELED] >= 1, "the probe's alarm gave way"
            assert types[EventType.EVENT_TYPE_TIMER_FIRED] >= 1, "the scale-in's rang"
        finally:
            await _stop(platform, handles)
