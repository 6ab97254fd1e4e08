"""The Runs' worker keeps only `--workflow-cache` workflows in memory: a Ready Run it evicted is
replayed from its history when its next task comes, and still ends as it should."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

from temporalio import client as temporal_client
from temporalio.client import Client
from temporalio.worker import (
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from kruntimes.api.phases import RunPhase
from kruntimes.contracts.names import SIGNAL_CANCEL
from kruntimes.workers.assembly import running_workers
from tests.support.pki import TestPKI
from tests.workflows.conftest import new_platform, run_manifest
from tests.workflows.platform_hosts import ready_on_host, registrations

CACHE = 2  # fewer than the Runs, the HostWorkflow and the scale-out this test starts


class _Instances(temporal_client.Interceptor, Interceptor):
    """Counts the workflow instances a worker builds, by workflow id: a second instance of one
    workflow is the worker replaying it after it left the cache."""

    def __init__(self) -> None:
        self.built: Counter[str] = Counter()

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        built = self.built

        class Counting(WorkflowInboundInterceptor):
            def init(self, outbound: WorkflowOutboundInterceptor) -> None:
                super().init(outbound)
                built[outbound.info().workflow_id] += 1

        return Counting


async def test_a_ready_run_evicted_from_the_cache_is_replayed_and_cancels_cleanly(
    client: Client, tmp_path: Path, pki: TestPKI
) -> None:
    instances = _Instances()
    counted = Client(**{**client.config(), "interceptors": [instances]})
    platform = new_platform(counted, tmp_path, pki)
    platform.settings = dataclasses.replace(platform.settings, workflow_cache=CACHE)
    try:
        async with running_workers(counted, platform.settings):
            runs: list[Any] = []
            for i in range(CACHE + 2):
                run = run_manifest(f"cached-{i}", runtime=platform.runtime())
                runs.append((run, await ready_on_host(platform, run)))
            (first, (handle, _, address)), *others = runs
            assert first.metadata.uid in registrations(platform.pki, address)

            await handle.signal(SIGNAL_CANCEL)
            final = await platform.wait_phase(handle, RunPhase.Cancelled)

            assert final.endpoint is None and final.completionTime is not None
            assert instances.built[handle.id] >= 2, "the first Run was never evicted and replayed"
            assert first.metadata.uid not in registrations(platform.pki, address)
            for _, (other, _, _) in others:  # the rest still Ready
                assert (await platform.status(other)).phase is RunPhase.Ready
    finally:
        await platform.stop()
