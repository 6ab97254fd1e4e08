"""One in-flight invocation per function: 50 parallel invokes, one runs, the rest get 429 at once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp

from kruntimes.gateway.server import Gateway
from tests.gateway.conftest import Answer, HostProcess, invoke, lines, recording

PARALLEL = 50
SLEEP_S = 2.0

# Each execution appends "start <t>" and "end <t>": executions overlapping would interleave.
TRACED = """
import os
import time

def handle(payload):
    path = os.environ["TEST_RECORD"]
    with open(path, "a") as f:
        f.write(f"start {time.time()}\\n")
    time.sleep(payload["sleep"])
    with open(path, "a") as f:
        f.write(f"end {time.time()}\\n")
    return {"done": True}
"""


async def test_fifty_parallel_invokes_one_runs_the_rest_429(
    gateway: Gateway, client: aiohttp.ClientSession, main_host: HostProcess, records_dir: Path
) -> None:
    path, fn = await recording(main_host, gateway, records_dir, TRACED)

    async def timed(i: int) -> tuple[Answer, float]:
        started = time.monotonic()
        answer = await invoke(
            client, gateway, fn.uid, {"sleep": SLEEP_S}, headers={"X-Kruntime-Invocation-ID": f"par-{i}"}
        )
        return answer, time.monotonic() - started

    results = await asyncio.gather(*(timed(i) for i in range(PARALLEL)))
    answers = [answer for answer, _ in results]

    statuses = sorted(a.status for a in answers)
    assert statuses == [200] + [429] * (PARALLEL - 1), statuses
    for i, answer in enumerate(answers):
        doc = answer.expect(answer.status).json
        assert doc["invocationId"] == f"par-{i}"
        if answer.status == 429:
            assert doc["reason"] == "FunctionBusy"
            assert answer.headers.get("Retry-After") == "1"
    # the refused ones were answered at once, not queued behind the running one
    assert max(took for answer, took in results if answer.status == 429) < SLEEP_S
    events = [line.split()[0] for line in lines(path)]
    assert events == ["start", "end"], events

    # a second wave after the first: again exactly one at a time, never two executing
    path.unlink()
    waves = []
    for _ in range(2):
        waves += await asyncio.gather(*(invoke(client, gateway, fn.uid, {"sleep": 0.3}) for _ in range(10)))
    ran = [a for a in waves if a.status == 200]
    assert {a.status for a in waves} <= {200, 429} and len(ran) >= 2
    events = [line.split()[0] for line in lines(path)]
    assert events == ["start", "end"] * len(ran), events
    stamps = [float(line.split()[1]) for line in lines(path)]
    assert stamps == sorted(stamps)
