"""A Function's faults under load (#43 item 7), on a platform of its own where every host holds one
Run (so each replica has a host of its own): a replica's host SIGKILLed — the other replica keeps
answering, the lost one is replaced, and only invocations in flight on it may fail (after
dispatch, never retried); the control plane's workers stopped — the Function's traffic does not
notice (the invoke path never touches Temporal)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
from collections.abc import AsyncIterator

import pytest

from kruntimes.activities.hosts.process import list_records
from kruntimes.api.function import Function
from kruntimes.sdk.client import Client, FunctionNotFound, KruntimesError
from kruntimes.sdk.functions import ready as function_ready
from tests.sdk.stack import Platform, manifest, start, unique
from tests.support.pki import TestPKI
from tests.support.waiting import eventually

CLIENTS = 6
CONCURRENCY = 4
SLOW = "import time\ndef handle(p):\n    time.sleep(0.05)\n    return {'ok': True}\n"
# what an invocation in flight on a killed replica may get: it was dispatched (it may have run)
AFTER_DISPATCH = ("502", "504", "OwnerUnreachable", "FunctionProcessExited", "UpstreamFailed")


@pytest.fixture(scope="module")
async def platform(tmp_path_factory: pytest.TempPathFactory, pki: TestPKI) -> AsyncIterator[Platform]:
    runtimes = [{"name": "python", "adapter": "python", "runs": 1, "maxHosts": 4}]
    async with start(tmp_path_factory.mktemp("fnfaults"), pki, runtimes=runtimes) as started:
        yield started


class Load:
    """CLIENTS callers invoking the Function back to back; each outcome kept in order."""

    def __init__(self, krt: Client, name: str) -> None:
        self.krt, self.name = krt, name
        self.outcomes: list[str] = []  # "200" or the error's class and text
        self._stop = asyncio.Event()

    async def _caller(self) -> None:
        while not self._stop.is_set():
            try:
                answer = await self.krt.functions.invoke(self.name, None, timeout=30)
                self.outcomes.append("200" if answer.ok else f"not ok: {answer}")
            except KruntimesError as e:
                self.outcomes.append(f"{type(e).__name__}: {e}")

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Load]:
        callers = [asyncio.create_task(self._caller()) for _ in range(CLIENTS)]
        try:
            yield self
        finally:
            self._stop.set()
            await asyncio.gather(*callers)

    async def answered(self, count: int, *, within: float = 60) -> None:
        target = len(self.outcomes) + count

        async def enough() -> bool:
            return len(self.outcomes) >= target

        await eventually(enough, within=within, what=f"{count} more answers")


@pytest.mark.timeout(300)
async def test_a_replica_host_killed_under_load_fails_only_what_ran_on_it_and_is_replaced(
    platform: Platform,
) -> None:
    name = unique("fault")
    document = manifest(
        name, source=SLOW, mode={"function": {"concurrency": CONCURRENCY}}, scale={"min": 2, "max": 2}
    )
    async with Client(platform.config) as krt:
        try:
            await krt.functions.apply(Function.from_dict({**document, "kind": "Function"}))
            await krt.functions.wait_ready(name, timeout=120)
            replicas = await krt.functions.replicas(name)
            runs = [await krt.get(r.name) for r in replicas]
            hosts = {run.status.assignedHostUID for run in runs if run.status is not None}
            assert len(hosts) == 2, "each replica on a host of its own (one Run per host)"
            victim = runs[0]
            assert victim.status is not None and victim.status.assignedHostUID
            [record] = [
                r for r in list_records(platform.state_dir) if r.hostUid == victim.status.assignedHostUID
            ]
            assert record.pid is not None
            load = Load(krt, name)
            async with load.running():
                await load.answered(30)
                before = len(load.outcomes)
                os.kill(record.pid, signal.SIGKILL)  # a host this test's platform started

                async def replaced() -> bool:
                    # the lost replica's Run moves to another host (the same Run, a new attempt)
                    moved = await krt.get(victim.metadata.name)
                    assert moved.status is not None
                    elsewhere = moved.status.assignedHostUID not in (None, record.hostUid)
                    return (
                        elsewhere
                        and moved.status.phase == "Ready"
                        and function_ready(await krt.functions.status(name))
                    )

                await eventually(replaced, within=120, what="the lost replica replaced by a Ready one")
                during = load.outcomes[before:]
                await load.answered(30)

                # the control plane's workers stopped: the Function's traffic does not notice
                await platform.workers.__aexit__(None, None, None)
                try:
                    quiet_from = len(load.outcomes)
                    await load.answered(40)
                    without_workers = load.outcomes[quiet_from:]
                finally:
                    await platform.workers.__aenter__()
            failed = collections.Counter(o for o in load.outcomes if o != "200")
            assert during.count("200") > 0, "the other replica kept answering while the lost one was replaced"
            assert sum(failed.values()) <= CONCURRENCY, (
                f"more failed than ran on the killed replica: {failed}"
            )
            assert all(any(m in o for m in AFTER_DISPATCH) for o in failed), (
                f"only after-dispatch failures: {failed}"
            )
            assert set(without_workers) == {"200"}, "the workers' absence touched the invoke path"
        finally:
            with contextlib.suppress(FunctionNotFound):
                await krt.functions.delete(name, timeout=120)
