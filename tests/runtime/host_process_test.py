"""The runtime host as a real process: ready file, health service, clean stop on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from runtime.server import HostOptions, RuntimeHost
from tests.runtime.conftest import alive, inline, wait_until


def test_the_host_process_serves_reports_health_and_stops_its_functions_on_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.host", "--host-id", "p-0", "--runtime", "python"]
        + ["--state-dir", str(tmp_path / "state"), "--ready-file", str(ready)],
        stderr=subprocess.PIPE,
    )
    try:
        assert wait_until(ready.exists, seconds=30), "host never wrote its ready file"
        info = json.loads(ready.read_text())
        assert info["pid"] == proc.pid
        with grpc.insecure_channel(info["address"]) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "kruntimes.rpc.v1.FunctionRuntime"):
                answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                assert answer.status == health_pb2.HealthCheckResponse.SERVING
            stub = pb_grpc.FunctionRuntimeStub(channel)
            reg = stub.RegisterFunction(
                pb.RegisterFunctionRequest(
                    run=pb.RunRef(run_uid=str(uuid.uuid4()), attempt=1),
                    config=pb.FunctionConfig(
                        adapter="python",
                        handler="main:handle",
                        inline=inline({"main.py": "import os\ndef handle(p):\n    return os.getpid()\n"}),
                    ),
                ),
                timeout=30,
            )
            assert reg.host_uid == info["hostUid"]
            answer = stub.InvokeFunction(
                pb.InvokeFunctionRequest(registration_id=reg.registration_id), timeout=30
            )
            function_pid = json.loads(answer.outputs_json)["result"]
        assert alive(function_pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert wait_until(lambda: not alive(function_pid)), "function processes must not outlive the host"
        assert not any((tmp_path / "state" / "work").iterdir()), "workspaces must be removed"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()


def test_function_processes_die_when_the_host_is_killed(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.host", "--host-id", "p-1", "--runtime", "python"]
        + ["--state-dir", str(tmp_path / "state"), "--ready-file", str(ready)],
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_until(ready.exists, seconds=30)
        address = json.loads(ready.read_text())["address"]
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.FunctionRuntimeStub(channel)
            reg = stub.RegisterFunction(
                pb.RegisterFunctionRequest(
                    run=pb.RunRef(run_uid=str(uuid.uuid4()), attempt=1),
                    config=pb.FunctionConfig(
                        adapter="python",
                        handler="main:handle",
                        inline=inline({"main.py": "import os\ndef handle(p):\n    return os.getpid()\n"}),
                    ),
                ),
                timeout=30,
            )
            answer = stub.InvokeFunction(
                pb.InvokeFunctionRequest(registration_id=reg.registration_id), timeout=30
            )
            function_pid = json.loads(answer.outputs_json)["result"]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while alive(function_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(function_pid), "a parent-death signal must take the function processes down"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


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
