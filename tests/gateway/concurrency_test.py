"""One in-flight invocation per function: while one runs, 49 more get 429 at once (not queued
behind it), and executions never overlap."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from kruntimes.gateway.server import Gateway
from tests.gateway.conftest import Answer, HostProcess, invoke, lines, recording
from tests.support.waiting import eventually

PARALLEL = 50

# Each execution appends "start <t>" and "end <t>": executions overlapping would interleave. One
# given a gate holds until the test creates that file; others sleep as asked.
TRACED = """
import os
import time

def handle(payload):
    path = os.environ["TEST_RECORD"]
    with open(path, "a") as f:
        f.write(f"start {time.time()}\\n")
    if "gate" in payload:
        while not os.path.exists(payload["gate"]):
            time.sleep(0.01)
    else:
        time.sleep(payload["sleep"])
    with open(path, "a") as f:
        f.write(f"end {time.time()}\\n")
    return {"done": True}
"""


async def test_while_one_invocation_runs_the_other_49_get_429_at_once(
    gateway: Gateway, client: aiohttp.ClientSession, main_host: HostProcess, records_dir: Path
) -> None:
    path, fn = await recording(main_host, gateway, records_dir, TRACED)
    gate = Path(f"{path}.go")

    def call(i: int, body: dict[str, object]) -> asyncio.Task[Answer]:
        headers = {"X-Kruntime-Invocation-ID": f"par-{i}"}
        return asyncio.create_task(invoke(client, gateway, fn.uid, body, headers=headers))

    first = call(0, {"gate": str(gate)})
    await eventually(lambda: lines(path), what="the first invocation running")
    # Answered while the first is still held by its gate: refused at once, not queued behind it.
    refused = await asyncio.gather(*(call(i, {"sleep": 0}) for i in range(1, PARALLEL)))
    held = not first.done()
    gate.touch()
    answers = [await first, *refused]

    assert held, "the running invocation was still held when every other one had its answer"
    assert [a.status for a in answers] == [200] + [429] * (PARALLEL - 1)
    for i, answer in enumerate(answers):
        doc = answer.expect(answer.status).json
        assert doc["invocationId"] == f"par-{i}"
        if answer.status == 429:
            assert doc["reason"] == "FunctionBusy"
            assert answer.headers.get("Retry-After") == "1"
    events = [line.split()[0] for line in lines(path)]
    assert events == ["start", "end"], "only the first ever ran"

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
