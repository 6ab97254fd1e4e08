"""The one plaintext port a host may have (`krt host --health-listen`, for a kubelet's probe)
serves grpc.health.v1 Check and nothing else: the attack is a client without a certificate calling
every FunctionRuntime method and the health service's stream on it. A real Runtime Server on
127.0.0.1, a real gRPC client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.runtime.server import RuntimeHost
from tests.support.pki import TestPKI
from tests.support.runtime_hosts import loopback_host


@pytest.fixture
def probed(pki: TestPKI, tmp_path: Path) -> Iterator[RuntimeHost]:
    host = loopback_host(pki, tmp_path, host_id="probed-0", health_listen="127.0.0.1:0")
    host.start()
    try:
        yield host
    finally:
        host.stop(grace_s=1)


def test_the_plaintext_health_port_answers_health_checks_and_nothing_else(probed: RuntimeHost) -> None:
    with grpc.insecure_channel(probed.health_address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        answer = health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as caught:
            next(iter(health.Watch(health_pb2.HealthCheckRequest(), timeout=10)))
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
        runtime = pb_grpc.FunctionRuntimeStub(channel)
        for call, request in (
            (runtime.HostInfo, pb.HostInfoRequest()),
            (runtime.RegisterFunction, pb.RegisterFunctionRequest()),
            (runtime.InvokeFunction, pb.InvokeFunctionRequest(registration_id="x")),
            (runtime.ExecuteTask, pb.ExecuteTaskRequest()),
        ):
            with pytest.raises(grpc.RpcError) as caught:
                call(request, timeout=10)
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
        with pytest.raises(grpc.RpcError) as caught:  # the messages it takes are small
            health.Check(health_pb2.HealthCheckRequest(service="x" * 4096), timeout=10)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
