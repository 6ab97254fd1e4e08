"""The attach provider's fence against a real host process: the host stops taking registrations
first, then the fence lists and unregisters what it holds, so a registration arriving meanwhile is
refused instead of outliving the fence."""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import pytest

from kruntimes.activities.hosts import AttachProvider, CreatedHost, ProcessProvider
from kruntimes.activities.hosts._rpc import HostRpcError, stop_registrations
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from tests.hosts.conftest import spec
from tests.support.pki import TestPKI

ECHO = b"def handle(p):\n    return p\n"


def register(pki: TestPKI, host: CreatedHost) -> pb.RegisterFunctionResponse:
    """A registration of a new Run on `host`, as the control plane makes one (signed assignment)."""
    run = pb.RunRef(run_uid=str(uuid.uuid4()), attempt=1, namespace="default", name="fn", runtime="python")
    assignment = pki.sign(
        run_uid=run.run_uid, attempt=1, host_id=host.hostId, host_uid=host.hostUid, runtime="python"
    )
    config = pb.FunctionConfig(
        adapter="python",
        handler="main:handle",
        inline=pb.InlineSource(files=[pb.InlineFile(name="main.py", content=ECHO)]),
    )
    with pki.channel(host.address, as_=pki.control_plane) as channel:
        answer: pb.RegisterFunctionResponse = pb_grpc.FunctionRuntimeStub(channel).RegisterFunction(
            pb.RegisterFunctionRequest(run=run, config=config, assignment=assignment), timeout=30
        )
    return answer


def held(pki: TestPKI, host: CreatedHost) -> list[str]:
    with pki.channel(host.address, as_=pki.control_plane) as channel:
        info = pb_grpc.FunctionRuntimeStub(channel).HostInfo(pb.HostInfoRequest(), timeout=10)
    return [r.registration_id for r in info.registrations]


def refused(pki: TestPKI, host: CreatedHost) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        register(pki, host)
    return caught.value


async def adopted(state_dir: Path, process: ProcessProvider) -> CreatedHost:
    started = await process.create(spec(state_dir))
    return await AttachProvider().create(spec(state_dir, provider="attach", attachAddress=started.address))


async def test_a_registration_arriving_after_the_host_stopped_taking_them_is_refused_and_the_fence_ends_the_rest(
    state_dir: Path, process: ProcessProvider, pki: TestPKI
) -> None:
    host = await adopted(state_dir, process)
    before = register(pki, host)
    assert held(pki, host) == [before.registration_id]
    with pytest.raises(HostRpcError):  # another incarnation's fence fences nothing
        await stop_registrations(host.address, host_uid="not-this-one", timeout_s=5)

    # the fence's first step, then a registration between it and the listing
    assert await stop_registrations(host.address, host_uid=host.hostUid, timeout_s=5)
    err = refused(pki, host)
    assert err.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    assert "fenced" in (err.details() or "")  # type: ignore[attr-defined]
    with pki.channel(host.address, as_=pki.control_plane) as channel, pytest.raises(grpc.RpcError) as task:
        pb_grpc.FunctionRuntimeStub(channel).ExecuteTask(
            pb.ExecuteTaskRequest(
                run=pb.RunRef(
                    run_uid=str(uuid.uuid4()), attempt=1, namespace="default", name="t", runtime="python"
                ),
                config=pb.FunctionConfig(adapter="python", handler="main:handle"),
                input=b"null",
            ),
            timeout=10,
        )
    assert task.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]

    fenced = await AttachProvider().fence(host)
    assert fenced.fenced, fenced
    assert "stopped taking registrations" in fenced.how and "1 registration(s)" in fenced.how
    assert held(pki, host) == []
    assert refused(pki, host).code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
