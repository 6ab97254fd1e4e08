"""The autoscaling activity (activities/function_load.py) on its own, in the SDK's activity
environment: a retried attempt goes on from the memory its predecessor heartbeat, a cancelled one
answers with its memory, and a host that does not answer counts no load. Its real hosts and
gateways: tests/workflows/function_autoscale_test.py."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from typing import Any

from temporalio.testing import ActivityEnvironment

from kruntimes.activities.function_load import FunctionLoadActivities
from kruntimes.contracts.function import AutoscaleInput, AutoscaleResult, LoadTarget, ScaleWindow
from kruntimes.decisions import autoscale
from tests.support.ports import refusing_port
from tests.support.waiting import eventually


def _input(**changes: Any) -> AutoscaleInput:
    fields: dict[str, Any] = {
        "functionUid": str(uuid.uuid4()),
        "namespace": "default",
        "name": "web",
        "min": 0,
        "max": 4,
        "target": 1.0,
        "scaleDownDelaySeconds": 0.0,
        "stableWindowSeconds": 6.0,
        "current": 1,
        "maxSeconds": 30.0,
    }
    return AutoscaleInput(**{**fields, **changes})


def _quiet_window(seconds: float) -> ScaleWindow:
    now = time.time()
    return ScaleWindow(samples=[(now - seconds + i, 0.0) for i in range(int(seconds))], lastAt=now - 1)


async def test_a_retried_attempt_goes_on_from_the_memory_its_predecessor_heartbeat(pki: Any) -> None:
    """Given a whole quiet window in its heartbeat details, the first sample (no replica: no load)
    takes the Function to zero at once; without them it could not (less than a window seen)."""
    env = ActivityEnvironment()
    details = [_quiet_window(8).model_dump(mode="json")]
    env.info = dataclasses.replace(env.info, attempt=2, heartbeat_details=details)
    beats: list[Any] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    started = time.monotonic()
    result: AutoscaleResult = await env.run(FunctionLoadActivities().autoscale_function, _input())
    assert (result.changed, result.previous, result.wanted, result.reason) == (True, 1, 0, autoscale.TO_ZERO)
    assert time.monotonic() - started < 5, "decided at its first sample, not after a new window"
    carried = [at for at, _ in details[0]["samples"]]
    kept = [at for at, _ in result.window.samples]
    assert kept[0] in carried and kept[-1] > carried[-1], "the carried window, then its own sample"


async def test_a_cancelled_attempt_answers_with_its_memory_and_an_unreachable_host_counts_nothing(
    pki: Any,
) -> None:
    """No window at all: nothing can be decided within a second; cancelled, it answers unchanged
    with the samples it took (a replica whose host address answers nothing counted 0)."""
    env = ActivityEnvironment()
    beats: list[Any] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    with refusing_port() as port:
        silent = LoadTarget(runUid=str(uuid.uuid4()), address=f"127.0.0.1:{port}", registrationId="reg-1")
        scaling = FunctionLoadActivities().autoscale_function
        task = asyncio.ensure_future(env.run(scaling, _input(replicas=[silent])))

        def sampled_twice() -> bool:
            return any(d and d[0] and len(d[0]["samples"]) >= 2 for d in beats)

        await eventually(sampled_twice, within=20, every=0.1, what="two samples heartbeat")
        env.cancel()
        result: AutoscaleResult = await task
    assert (result.changed, result.previous, result.wanted) == (False, 1, 1)
    assert len(result.window.samples) >= 2 and all(load == 0.0 for _, load in result.window.samples)
