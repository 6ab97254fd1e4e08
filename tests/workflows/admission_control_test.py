"""An operator's admission control of a runtime (pause, resume, drain) through the SDK, the real
pool workflow and real process hosts, while Runs arrive."""

from __future__ import annotations

from kruntimes.api.phases import RunPhase
from kruntimes.contracts.pool import QUEUE_DRAINED
from kruntimes.sdk.client import Client
from tests.workflows.conftest import Platform, run_manifest


async def _queued(sdk: Client, platform: Platform, n: int) -> bool:
    return len((await sdk.queue(platform.runtime())).queued) == n


async def test_a_paused_runtime_queues_runs_drains_them_with_a_reason_and_places_them_once_resumed(
    platform_factory,
) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory() as platform:
        sdk = Client(temporal=platform.client)
        rt = platform.runtime()
        paused = await sdk.pause_queue(rt, message="maintenance", requested_by="alice")
        assert paused.paused and paused.queued == 0
        first = await platform.start(run_manifest("first", runtime=rt))
        await platform.eventually(lambda: _queued(sdk, platform, 1), what="the first Run queued")
        view = await sdk.queue(rt)
        assert (view.paused, view.by, view.message) == (True, "alice", "maintenance")
        pool = await platform.pool()
        assert not pool.hosts and not pool.scaleOuts, "nothing is placed or scaled out while paused"

        drained = await sdk.drain_queue(rt, message="closing for the night", requested_by="bob")
        assert drained.paused
        status = await platform.wait_phase(first, RunPhase.Failed)
        failed = status.condition("Ready")
        assert failed is not None and failed.reason == QUEUE_DRAINED
        assert "closing for the night" in failed.message and "bob" in failed.message

        second = await platform.start(run_manifest("second", runtime=rt))
        await platform.eventually(lambda: _queued(sdk, platform, 1), what="the second Run queued")
        resumed = await sdk.resume_queue(rt, message="done", requested_by="alice")
        assert not resumed.paused
        assert (await platform.wait_phase(second, RunPhase.Ready)).assignedHost is not None
        assert not (await sdk.queue(rt)).paused
