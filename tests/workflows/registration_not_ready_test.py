"""A registration its host marks NotReady (fatal: its function process cannot be started again)
through the real workflows and a real process host: the Run registers again at a new attempt."""

from __future__ import annotations

import json

from kruntimes.api.phases import RunPhase
from kruntimes.rpc.v1 import runtime_pb2 as pb
from tests.workflows.conftest import run_manifest
from tests.workflows.platform_hosts import address_of, invoke_on_host, ready_on_host

# Its first call ends the process at attempt 1; a second start in the same workspace (the
# registration's) fails to load, so the registration has no process left: NotReady. Attempt 2
# has a workspace of its own and answers.
ONCE_PER_WORKSPACE = """
import os
if os.path.exists("loaded-once"):
    raise RuntimeError("second start refused")
open("loaded-once", "w").close()
def handle(p):
    if os.environ["KRT_ATTEMPT"] == "1":
        os._exit(1)
    return {"attempt": os.environ["KRT_ATTEMPT"]}
"""


async def test_a_registration_its_host_marks_not_ready_is_registered_again_at_a_new_attempt(
    platform_factory,
) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(heartbeat_s=1.0) as platform:
        run = run_manifest("not-ready", runtime=platform.runtime(), source=ONCE_PER_WORKSPACE)
        handle, _host, address = await ready_on_host(platform, run)
        assert (await platform.status(handle)).attempt == 1
        died = invoke_on_host(platform.pki, address, run.metadata.uid, b"{}")  # type: ignore[arg-type]
        assert died.status == pb.INVOCATION_STATUS_PROCESS_EXITED

        async def again() -> bool:
            status = await platform.status(handle)
            return status.phase is RunPhase.Ready and status.attempt == 2

        await platform.eventually(again, timeout=60, what="the Run Ready again at attempt 2")
        status = await platform.status(handle)
        assert status.assignedHost is not None
        address = await address_of(platform, status.assignedHost)
        answer = invoke_on_host(platform.pki, address, run.metadata.uid, b"{}")  # type: ignore[arg-type]
        assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED
        assert json.loads(answer.outputs_json) == {"attempt": "2"}
