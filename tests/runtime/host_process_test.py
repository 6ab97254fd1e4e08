"""The runtime host as a real process: ready file, health service, clean stop on SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from runtime.server import HostOptions, RuntimeHost
from tests.runtime.conftest import IDENTITY, alive, function_gone, inline, wait_until


def register_identity_function(
    stub: pb_grpc.FunctionRuntimeStub,
) -> tuple[pb.RegisterFunctionResponse, dict[str, int]]:
    """Register a function that answers with its uid and pid; invoke it once for them."""
    reg = stub.RegisterFunction(
        pb.RegisterFunctionRequest(
            run=pb.RunRef(run_uid=str(uuid.uuid4()), attempt=1),
            config=pb.FunctionConfig(
                adapter="python",
                handler="main:handle",
                inline=inline({"main.py": IDENTITY}),
            ),
        ),
        timeout=30,
    )
    answer = stub.InvokeFunction(pb.InvokeFunctionRequest(registration_id=reg.registration_id), timeout=30)
    return reg, json.loads(answer.outputs_json)


@contextlib.contextmanager
def host_process(tmp_path: Path, host_id: str) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, Any]]]:
    """`python -m workers.host` (its ports picked at run time) and what it wrote to its ready file;
    killed at the end if it still runs."""
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.host", "--host-id", host_id, "--runtime", "python"]
        + ["--state-dir", str(tmp_path / "state"), "--ready-file", str(ready)],
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_until(ready.exists, seconds=30), "host never wrote its ready file"
        yield proc, json.loads(ready.read_text())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_host_process_serves_reports_health_and_stops_its_functions_on_sigterm(tmp_path: Path) -> None:
    with host_process(tmp_path, "p-0") as (proc, info):
        assert info["pid"] == proc.pid
        with grpc.insecure_channel(info["address"]) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "kruntimes.rpc.v1.FunctionRuntime"):
                answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                assert answer.status == health_pb2.HealthCheckResponse.SERVING
            stub = pb_grpc.FunctionRuntimeStub(channel)
            reg, function = register_identity_function(stub)
            assert reg.host_uid == info["hostUid"]
        assert not function_gone(function)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert wait_until(lambda: function_gone(function)), "function processes must not outlive the host"
        assert not any((tmp_path / "state" / "work").iterdir()), "workspaces must be removed"


def test_function_processes_die_when_the_host_is_killed(tmp_path: Path) -> None:
    with host_process(tmp_path, "p-1") as (proc, info):
        with grpc.insecure_channel(info["address"]) as channel:
            _, function = register_identity_function(pb_grpc.FunctionRuntimeStub(channel))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert wait_until(lambda: function_gone(function)), (
            "a parent-death signal must take the function processes down"
        )


def test_a_host_that_cannot_listen_fails_to_start_and_leaves_nothing_running(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        host = RuntimeHost(
            HostOptions(
                host_id="t-0",
                runtime="python",
                listen="127.0.0.1:0",
                invoke_listen=f"127.0.0.1:{busy.getsockname()[1]}",
                state_dir=tmp_path,
            )
        )
        with pytest.raises(OSError):
            host.start()
    zygote = host.spawner.zygote_pid
    assert zygote is not None and not alive(zygote), "the zygote must not outlive a failed start"
