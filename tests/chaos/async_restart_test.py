"""Async invocations across a control-plane crash (issue #44), on the embedded platform (`krt up
--detach`: real processes, the Temporal dev server on its SQLite file): with 200 invocations
accepted and most still queued, the worker is SIGKILLed and the dev server SIGKILLed (the
platform starts each again, the dev server on its database). Every invocation ends (Succeeded, or
Unknown for an attempt the killed worker held: it may have run), and none runs twice: each
execution leaves a file named by its invocation id, and the test counts them."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from kruntimes.api.run import Run
from kruntimes.sdk import config as clientconfig
from kruntimes.sdk.client import Client, Invocation
from tests.support.embedded import Embedded, embedded_platform
from tests.support.waiting import eventually

INVOCATIONS = 200
# One file per execution (functions run as their own uids: none shares a file), then a short
# sleep so the invocations wait their turn behind each other.
RECORDING = """\
import os, time, uuid

def handle(payload, context):
    name = f"{context.invocation_id}.{uuid.uuid4().hex}"
    open(os.path.join(os.environ["RECORDS"], name), "x").close()
    time.sleep(0.05)
    return {"ok": True}
"""
RUNTIMES = """\
runtimes:
  - {name: python, adapter: python, runs: 4, minHosts: 1, maxHosts: 1}
"""
SETTLE_S = 240.0


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Embedded, Path]]:
    root = tmp_path_factory.mktemp("async-restart")
    state, records = root / "state", root / "records"
    state.mkdir()
    records.mkdir()
    records.chmod(0o1777)  # the functions write here as their own uids
    (state / "runtimes.yaml").write_text(RUNTIMES + f"sharedDirectories: [{records}]\n")
    with embedded_platform(state) as started:
        yield started, records


def _ran(records: Path) -> Counter[str]:
    return Counter(path.name.rpartition(".")[0] for path in records.iterdir())


@pytest.mark.timeout(400)
async def test_the_worker_and_the_dev_server_killed_with_invocations_queued_each_ends_none_runs_twice(
    platform: tuple[Embedded, Path],
) -> None:
    embedded, records = platform
    config = clientconfig.load({"KRT_STATE_DIR": str(embedded.state)})
    async with Client(config) as krt:
        name = "drain"
        await krt.create(
            Run.new(
                name,
                runtime="python",
                handler="main:handle",
                inline={"main.py": RECORDING},
                env={"RECORDS": str(records)},
                uid=str(uuid.uuid4()),
                mode={"function": {"concurrency": 8, "asyncInvocations": {"share": 100}}},
            )
        )
        run = await krt.wait(name, timeout=90)
        ids = [f"q-{n:03d}-{uuid.uuid4().hex[:6]}" for n in range(INVOCATIONS)]
        gate = asyncio.Semaphore(16)

        async def submit(inv: str) -> None:
            async with gate:
                await krt.invoke_async(run, {}, invocation_id=inv)

        await asyncio.gather(*(submit(inv) for inv in ids))
        assert sum(_ran(records).values()) < INVOCATIONS, "most are still queued at the crash"
        worker, temporal = embedded.proc("worker"), embedded.proc("temporal")
        os.kill(worker.pid, signal.SIGKILL)  # the platform's own worker and dev server
        os.kill(temporal.pid, signal.SIGKILL)

        def restarted() -> bool:
            live = embedded.record().components
            return (
                live.get("worker", worker.pid) != worker.pid
                and live.get("temporal", temporal.pid) != temporal.pid
            )

        await eventually(restarted, within=90, every=0.2, what="the worker and the dev server started again")

        async def read(inv: str) -> Invocation:
            return await krt.invocations.get(run, inv)

        async def all_ended() -> list[Invocation] | None:
            pending = [inv for inv in ids if inv not in ended]
            for inv in pending[:50]:  # a bounded read a round
                got = await read(inv)
                if got.done:
                    ended[inv] = got
            return list(ended.values()) if len(ended) == INVOCATIONS else None

        ended: dict[str, Invocation] = {}
        await eventually(
            all_ended, within=SETTLE_S, every=0.5, ignoring=(Exception,), what="every invocation ended"
        )
    ran = _ran(records)
    twice = [inv for inv, n in ran.items() if n > 1]
    assert not twice, f"ran twice: {twice[:5]}"
    states = Counter(i.state.value for i in ended.values())
    assert set(states) <= {"Succeeded", "Unknown"}, states
    for inv, got in ended.items():
        if got.state.value == "Succeeded":
            assert ran[inv] == 1, f"{inv} Succeeded without running once"
        else:  # an attempt the killed worker held: it may have run, and it was not repeated
            assert got.error is not None and got.error.reason == "AttemptLost", got
            assert got.attempts and got.attempts[-1].dispatched, got
            assert ran[inv] <= 1
    assert set(ran) <= set(ids), "only these invocations ran"
