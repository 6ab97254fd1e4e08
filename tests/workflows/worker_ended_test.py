"""A worker process whose Temporal worker stops without being asked says so and ends, so that its
supervisor starts it again: left running, it would serve only part of its task queues (Runs
waiting for a pool that nobody polls)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporalio.client import Client

from kruntimes.workers.assembly import running_workers, until_stopped
from tests.support.pki import TestPKI
from tests.workflows.conftest import new_platform


async def test_a_temporal_worker_that_stops_on_its_own_ends_the_wait_with_its_task_queue(
    client: Client, tmp_path: Path, pki: TestPKI
) -> None:
    platform = new_platform(client, tmp_path, pki)
    try:
        async with running_workers(client, platform.settings) as running:
            pools = next(w for w in running if w.task_queue == platform.settings.pool_task_queue)
            await pools.shutdown()  # the pools' worker stops; nobody asked the process to

            ended = await asyncio.wait_for(until_stopped(asyncio.Event(), running), timeout=30)

            assert ended == f"the worker of task queue {platform.settings.pool_task_queue!r} stopped"
    finally:
        await platform.stop()


async def test_a_process_asked_to_stop_is_not_told_that_a_worker_ended(
    client: Client, tmp_path: Path, pki: TestPKI
) -> None:
    platform = new_platform(client, tmp_path, pki)
    stop = asyncio.Event()
    try:
        async with running_workers(client, platform.settings) as running:
            stop.set()
            assert await asyncio.wait_for(until_stopped(stop, running), timeout=30) is None
        assert not running.ended.done()  # the workers' own shutdown is no failure
    finally:
        await platform.stop()
