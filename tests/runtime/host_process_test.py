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

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.runtime.server import HostConfigError, HostOptions, RuntimeHost
from tests.runtime.conftest import IDENTITY, function_gone, inline
from tests.support.pki import TestPKI
from tests.support.procs import alive
from tests.support.runtime_hosts import loopback_host
from tests.support.waiting import wait_until


def register_identity_function(
    pki: TestPKI, address: str, *, host_id: str, host_uid: str
) -> tuple[pb.RegisterFunctionResponse, dict[str, int]]:
    """Register a function that answers with its uid and pid; invoke it once for them."""
    run = pb.RunRef(run_uid=str(uuid.uuid4()), attempt=1, namespace="default", name="pid", runtime="python")
    signed = pki.sign(run_uid=run.run_uid, attempt=1, host_id=host_id, host_uid=host_uid, name="pid")
    with pki.channel(address, as_=pki.control_plane) as channel:
        reg = pb_grpc.FunctionRuntimeStub(channel).RegisterFunction(
            pb.RegisterFunctionRequest(
                run=run,
                config=pb.FunctionConfig(
                    adapter="python", handler="main:handle", inline=inline({"main.py": IDENTITY})
                ),
                assignment=signed,
            ),
            timeout=30,
        )
    with pki.channel(address, as_=pki.gateway) as channel:
        answer = pb_grpc.FunctionRuntimeStub(channel).InvokeFunction(
            pb.InvokeFunctionRequest(registration_id=reg.registration_id), timeout=30
        )
    return reg, json.loads(answer.outputs_json)


@contextlib.contextmanager
def host_process(
    tmp_path: Path, host_id: str, pki: TestPKI
) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, Any]]]:
    """`python -m kruntimes.workers.host` (its ports picked at run time) and what it wrote to its ready file;
    killed at the end if it still runs."""
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kruntimes.workers.host", "--host-id", host_id, "--runtime", "python"]
        + ["--state-dir", str(tmp_path / "state"), "--ready-file", str(ready), *pki.host_args(host_id)],
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_until(ready.exists, within=30), "host never wrote its ready file"
        yield proc, json.loads(ready.read_text())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_host_process_serves_reports_health_and_stops_its_functions_on_sigterm(
    tmp_path: Path, pki: TestPKI
) -> None:
    with host_process(tmp_path, "p-0", pki) as (proc, info):
        assert info["pid"] == proc.pid
        with pki.channel(info["address"], as_=pki.control_plane) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "kruntimes.rpc.v1.FunctionRuntime"):
                answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                assert answer.status == health_pb2.HealthCheckResponse.SERVING
        reg, function = register_identity_function(
            pki, info["address"], host_id="p-0", host_uid=info["hostUid"]
        )
        assert reg.host_uid == info["hostUid"]
        assert not function_gone(function)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert wait_until(lambda: function_gone(function)), "function processes must not outlive the host"
        assert not any((tmp_path / "state" / "work").iterdir()), "workspaces must be removed"


def test_function_processes_die_when_the_host_is_killed(tmp_path: Path, pki: TestPKI) -> None:
    with host_process(tmp_path, "p-1", pki) as (proc, info):
        _, function = register_identity_function(
            pki, info["address"], host_id="p-1", host_uid=info["hostUid"]
        )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert wait_until(lambda: function_gone(function)), (
            "a parent-death signal must take the function processes down"
        )


def test_a_host_that_cannot_listen_fails_to_start_and_leaves_nothing_running(
    tmp_path: Path, pki: TestPKI
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        host = loopback_host(pki, tmp_path, host_id="t-0", invoke_listen=f"127.0.0.1:{busy.getsockname()[1]}")
        with pytest.raises(OSError):
            host.start()
    zygote = host.spawner.zygote_pid
    assert zygote is not None and not alive(zygote), "the zygote must not outlive a failed start"


def test_a_host_starts_only_with_its_own_certificate_and_the_assignment_key(
    tmp_path: Path, pki: TestPKI
) -> None:
    base = {"host_id": "t-1", "runtime": "python", "listen": "127.0.0.1:0", "state_dir": tmp_path}
    with pytest.raises(HostConfigError):
        RuntimeHost(HostOptions(**base))  # type: ignore[arg-type]
    with pytest.raises(HostConfigError):
        RuntimeHost(HostOptions(**base, tls=pki.host_tls("t-1")))  # type: ignore[arg-type]
    with pytest.raises(HostConfigError, match="names spiffe://kruntimes.io/host/python/t-2"):
        RuntimeHost(HostOptions(**base, tls=pki.host_tls("t-2"), assignments=pki.verifier()))  # type: ignore[arg-type]
    # and `krt host` refuses to start without them
    done = subprocess.run(
        [sys.executable, "-m", "kruntimes.workers.host", "--host-id", "t-1", "--runtime", "python"]
        + ["--state-dir", str(tmp_path / "state")],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode != 0 and b"--peer-tls" in done.stderr
