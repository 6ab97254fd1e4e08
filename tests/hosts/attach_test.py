"""The attach provider adopts running hosts and never stops them."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from kruntimes.activities.hosts import AttachProvider, HostManager, ProcessProvider
from kruntimes.decisions.scheduling.failures import FailureReason, ProviderError, ProviderOperation
from tests.hosts.conftest import spec
from tests.support.pki import TestPKI
from tests.support.ports import refusing_port
from tests.support.procs import alive


async def test_attach_adopts_a_running_host_and_delete_does_not_stop_it(
    state_dir: Path, process: ProcessProvider
) -> None:
    manager = HostManager([process, AttachProvider()])
    started = await manager.create(spec(state_dir))
    assert started.pid is not None

    adopted = await manager.create(spec(state_dir, provider="attach", attachAddress=started.address))

    assert (adopted.provider, adopted.hostId, adopted.pid) == ("attach", "python-0", None)
    assert (adopted.hostUid, adopted.address) == (started.hostUid, started.address)
    assert await manager.probe(adopted)
    assert not await manager.delete(
        provider="attach", runtime="python", host_id="python-0", host_uid=adopted.hostUid
    )
    assert alive(started.pid)
    assert await manager.probe(started)


async def test_attach_without_an_address_is_a_permanent_failure(tmp_path: Path) -> None:
    with pytest.raises(ProviderError) as caught:
        await AttachProvider().create(spec(tmp_path, provider="attach"))

    failure = caught.value.failure
    assert (failure.reason, failure.retryable) == (FailureReason.EndpointMissing, False)
    assert (failure.operation, failure.host) == (ProviderOperation.Attach, "python-0")


async def test_attach_to_an_address_nobody_listens_on_is_retryably_unavailable(tmp_path: Path) -> None:
    with refusing_port() as port, pytest.raises(ProviderError) as caught:
        address = f"127.0.0.1:{port}"
        await AttachProvider(rpc_timeout_s=2).create(spec(tmp_path, provider="attach", attachAddress=address))

    assert (caught.value.reason, caught.value.retryable) == (FailureReason.ProviderUnavailable, True)
    assert isinstance(caught.value.__cause__, Exception)


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.1:http", ":50051", "127.0.0.1:70000"])
async def test_attach_to_a_malformed_address_is_invalid(tmp_path: Path, address: str) -> None:
    with pytest.raises(ProviderError) as caught:
        await AttachProvider().create(spec(tmp_path, provider="attach", attachAddress=address))

    assert (caught.value.reason, caught.value.retryable) == (FailureReason.EndpointInvalid, False)


async def test_attach_to_a_grpc_server_that_is_not_a_runtime_host_is_an_invalid_response(
    tmp_path: Path, pki: TestPKI
) -> None:
    server = grpc.aio.server()  # a platform host's certificate, but no FunctionRuntime
    port = server.add_secure_port("127.0.0.1:0", pki.host_tls("python-0").server_credentials())
    await server.start()
    try:
        with pytest.raises(ProviderError) as caught:
            await AttachProvider().create(
                spec(tmp_path, provider="attach", attachAddress=f"127.0.0.1:{port}")
            )
    finally:
        await server.stop(None)

    assert (caught.value.reason, caught.value.retryable) == (FailureReason.InvalidResponse, False)


async def test_attach_refuses_a_host_of_another_runtime(state_dir: Path, process: ProcessProvider) -> None:
    started = await process.create(spec(state_dir))

    with pytest.raises(ProviderError) as caught:
        await AttachProvider().create(
            spec(state_dir, "bash-0", runtime="bash", provider="attach", attachAddress=started.address)
        )

    assert (caught.value.reason, caught.value.retryable) == (FailureReason.OperationRejected, False)
    assert await process.probe(started)


async def test_attach_refuses_a_host_under_another_host_id(state_dir: Path, process: ProcessProvider) -> None:
    """Assignments name the host by the id its certificate carries: adopting it under another id
    would make every registration on it fail."""
    started = await process.create(spec(state_dir))

    with pytest.raises(ProviderError) as caught:
        await AttachProvider().create(
            spec(state_dir, "adopted-0", provider="attach", attachAddress=started.address)
        )

    assert (caught.value.reason, caught.value.retryable) == (FailureReason.OperationRejected, False)


async def test_attach_to_a_plaintext_server_is_unavailable(tmp_path: Path) -> None:
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        with pytest.raises(ProviderError) as caught:
            await AttachProvider(rpc_timeout_s=2).create(
                spec(tmp_path, provider="attach", attachAddress=f"127.0.0.1:{port}")
            )
    finally:
        await server.stop(None)

    assert (caught.value.reason, caught.value.retryable) == (FailureReason.ProviderUnavailable, True)
