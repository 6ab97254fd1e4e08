"""A real runtime host whose functions attack it: an attacker function runs whatever code its
payload carries; a victim function holds a secret. The host's state directory holds what a
platform's does (token file, client config, TLS key, codec keys) so a read attempt has targets.

Every test here runs as root (CI does): uid switching, namespaces and cgroups need it. Where the
host cannot use a mechanism, isolation/fallback_test.py checks what it does instead.
"""

from __future__ import annotations

import json
import socket
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.runtime.limits import ProcessLimits
from kruntimes.runtime.sandbox.policy import Network, SandboxSettings
from kruntimes.runtime.server import RuntimeHost
from tests.support.pki import TestPKI
from tests.support.runtime_hosts import loopback_host

MiB = 1024 * 1024
SECRET = "victim-secret-4f2a9c"
MEMORY_LIMIT = 128 * MiB
PROCESS_LIMIT = 48
FILE_LIMIT = 8 * MiB

ATTACKER = """
import json, os
def handle(p):
    scope = {"os": os, "json": json}
    exec(p["code"], scope)
    return {"result": scope.get("result")}
"""
VICTIM = """
import os, time
def handle(p):
    if p.get("sleep"):
        time.sleep(p["sleep"])
    return {"ok": True, "uid": os.getuid(), "secret_seen": os.environ.get("DB_PASSWORD") is not None}
"""
STATE_SECRETS = {
    "tokens.csv": 'krt_admin_token_0123456789,admin,0,"admins"\n',
    "client.json": '{"token": "krt_admin_token_0123456789"}\n',
    "tls/tls.key": "-----BEGIN PRIVATE KEY-----\nsecretkeymaterial\n-----END PRIVATE KEY-----\n",
    "codec-keys/20261201T000000Z": "c2VjcmV0a2V5bWF0ZXJpYWxzZWNyZXRrZXltYXRlcmlhbA==\n",
}


@dataclass
class Function:
    host: HostUnderAttack
    registration_id: str
    run_uid: str

    def invoke(self, payload: dict[str, Any], *, timeout_ms: int = 20_000) -> pb.InvokeFunctionResponse:
        return self.host.gateway.InvokeFunction(
            pb.InvokeFunctionRequest(
                registration_id=self.registration_id,
                payload=json.dumps(payload).encode(),
                timeout_ms=timeout_ms,
            ),
            timeout=timeout_ms / 1000 + 10,
        )

    def run(self, code: str, *, timeout_ms: int = 20_000) -> Any:
        """Run `code` inside the function; what it leaves in `result` comes back."""
        answer = self.invoke({"code": textwrap.dedent(code)}, timeout_ms=timeout_ms)
        assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED, (answer.error.type, answer.error.message)
        return json.loads(answer.outputs_json)["result"]

    @property
    def workdir(self) -> Path:
        reg = self.host.runtime.registry.get(self.registration_id)
        assert reg is not None
        return reg.workdir

    @property
    def uid(self) -> int:
        reg = self.host.runtime.registry.get(self.registration_id)
        assert reg is not None and reg.lease is not None and reg.lease.uid is not None
        return reg.lease.uid

    @property
    def pids(self) -> list[int]:
        """Its processes as the host sees them (the init of its namespace and its descendants)."""
        reg = self.host.runtime.registry.get(self.registration_id)
        assert reg is not None and reg.process is not None
        return [reg.process.pid, *_descendants(reg.process.pid)]

    def answers(self) -> bool:
        try:
            return (
                self.invoke({"code": "result = 1"}, timeout_ms=10_000).status
                == pb.INVOCATION_STATUS_SUCCEEDED
            )
        except grpc.RpcError:
            return False


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return found
    for child in map(int, children):
        found += [child, *_descendants(child)]
    return found


@dataclass
class HostUnderAttack:
    runtime: RuntimeHost
    stub: pb_grpc.FunctionRuntimeStub  # as the control plane
    gateway: pb_grpc.FunctionRuntimeStub  # as a gateway (invokes)
    pki: TestPKI
    state_dir: Path
    listener: socket.socket  # something on the host's loopback a function must not reach

    def registration(
        self, config: pb.FunctionConfig, *, run_uid: str | None = None
    ) -> pb.RegisterFunctionRequest:
        """A RegisterFunction request with the control plane's signed assignment of a new Run."""
        run = pb.RunRef(
            run_uid=run_uid or str(uuid.uuid4()), attempt=1, namespace="default", name="fn", runtime="python"
        )
        signed = self.pki.sign(
            run_uid=run.run_uid,
            attempt=1,
            host_id=self.runtime.options.host_id,
            host_uid=self.runtime.host_uid,
        )
        return pb.RegisterFunctionRequest(run=run, config=config, assignment=signed)

    def register(self, source: str, *, env: dict[str, str] | None = None) -> Function:
        config = pb.FunctionConfig(
            adapter="python",
            handler="main:handle",
            env=env or {},
            inline=pb.InlineSource(files=[pb.InlineFile(name="main.py", content=source.encode())]),
        )
        request = self.registration(config)
        answer = self.stub.RegisterFunction(request, timeout=60)
        return Function(self, answer.registration_id, request.run.run_uid)

    def answers(self) -> bool:
        return self.stub.HostInfo(pb.HostInfoRequest(), timeout=10).host_uid == self.runtime.host_uid


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, pki: TestPKI) -> Iterator[HostUnderAttack]:
    state = tmp_path_factory.mktemp("state")
    for name, content in STATE_SECRETS.items():
        path = state / name
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_text(content)
        path.chmod(0o600)
    listener = socket.create_server(("127.0.0.1", 0))
    runtime = loopback_host(
        pki,
        state,
        host_id="attacked-0",
        limits=ProcessLimits(file_size_bytes=FILE_LIMIT, processes=PROCESS_LIMIT),
        sandbox=SandboxSettings(
            network=Network.NONE,
            memory_bytes=MEMORY_LIMIT,
            max_processes=PROCESS_LIMIT,
            tmp_bytes=16 * MiB,
        ),
    )
    address = runtime.start()
    control = pki.channel(address, as_=pki.control_plane)
    gateway = pki.channel(address, as_=pki.gateway)
    try:
        yield HostUnderAttack(
            runtime,
            pb_grpc.FunctionRuntimeStub(control),
            pb_grpc.FunctionRuntimeStub(gateway),
            pki,
            state,
            listener,
        )
    finally:
        control.close()
        gateway.close()
        runtime.stop(grace_s=1)
        listener.close()


@pytest.fixture(scope="module")
def victim(target: HostUnderAttack) -> Function:
    return target.register(VICTIM, env={"DB_PASSWORD": SECRET})


@pytest.fixture
def attacker(target: HostUnderAttack) -> Iterator[Function]:
    """A fresh attacker per test, unregistered afterwards."""
    function = target.register(ATTACKER)
    yield function
    target.stub.UnregisterFunction(
        pb.UnregisterFunctionRequest(registration_id=function.registration_id, grace_ms=100), timeout=30
    )


@pytest.fixture(autouse=True)
def nothing_else_is_harmed(target: HostUnderAttack, victim: Function) -> Iterator[None]:
    """After every attack the host and the other function still answer."""
    yield
    assert target.answers(), "the host must still answer"
    answer = victim.invoke({})
    assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED and json.loads(answer.outputs_json)["ok"]
