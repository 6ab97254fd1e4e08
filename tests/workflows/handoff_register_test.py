"""running_workers(handoff_register=...): what the in-process handoff registers with (the lifecycle
bench's --host-work measures a burst with the hosts' work taken off the Runs' path this way)."""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.client import Client

from kruntimes.activities.handoff import Register
from kruntimes.api.phases import RunPhase
from kruntimes.contracts.hostcalls import RegisterInput, RegisterResult
from kruntimes.workers.assembly import running_workers
from tests.support.pki import TestPKI
from tests.workflows.conftest import new_platform, run_manifest
from tests.workflows.platform_hosts import address_of, invoke_on_host

ATTEMPTS = 10  # Runs created one after another until one is handed over in-process


async def test_the_handoff_registers_attempt_one_through_the_register_it_is_given(
    client: Client, tmp_path: Path, pki: TestPKI
) -> None:
    platform = new_platform(client, tmp_path, pki, python={"minHosts": 1})
    through: list[RegisterInput] = []

    def counted(register: Register) -> Register:
        async def registering(request: RegisterInput) -> RegisterResult:
            through.append(request)
            return await register(request)

        return registering

    try:
        async with running_workers(client, platform.settings, handoff_register=counted):
            # The first Runs may ask before this process has seen that it alone polls the pools'
            # queue (then the pool's answer comes by signal, and no handoff registers them).
            for i in range(ATTEMPTS):
                run = run_manifest(f"through-{i}", runtime=platform.runtime())
                handle = await platform.start(run, by_sdk=True)
                status = await platform.wait_phase(handle, RunPhase.Ready)
                if any(r.runUid == run.metadata.uid for r in through):
                    break
            [request] = [r for r in through if r.runUid == run.metadata.uid]
            assert (request.attempt, request.hostId) == (1, status.assignedHost)
            # what it registered through was the host's own registration: the Run answers there
            assert status.assignedHost is not None and run.metadata.uid is not None
            address = await address_of(platform, status.assignedHost)
            answer = invoke_on_host(pki, address, run.metadata.uid, b'{"x": 1}')
            assert json.loads(answer.outputs_json)["echo"] == {"x": 1}
    finally:
        await platform.stop()
