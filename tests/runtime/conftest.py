"""A real Runtime Server on loopback (gRPC, zygote, function processes) for the runtime tests,
called over mutual TLS as the platform calls it: `stub` presents the control plane's certificate
(registering, status, tasks), `gateway` a gateway's (invoking)."""

from __future__ import annotations

import contextlib
import os
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.runtime.limits import ProcessLimits
from kruntimes.runtime.sandbox.identity import processes_of
from kruntimes.runtime.sandbox.policy import SandboxSettings
from kruntimes.runtime.server import RuntimeHost
from kruntimes.wire.reasons import reason_of
from tests.support.pki import TestPKI
from tests.support.procs import alive
from tests.support.runtime_hosts import loopback_host


def inline(files: dict[str, str], *, executable: tuple[str, ...] = ()) -> pb.InlineSource:
    return pb.InlineSource(
        files=[
            pb.InlineFile(name=name, content=textwrap.dedent(text).encode(), executable=name in executable)
            for name, text in files.items()
        ]
    )


ECHO_SOURCE = "def handle(p):\n    return p\n"


def run_ref(uid: str | None = None, *, attempt: int = 1, name: str = "fn") -> pb.RunRef:
    """A Run of namespace default and runtime python (the test host's)."""
    return pb.RunRef(
        run_uid=uid or str(uuid.uuid4()), attempt=attempt, namespace="default", name=name, runtime="python"
    )


@dataclass
class Host:
    runtime: RuntimeHost
    stub: pb_grpc.FunctionRuntimeStub  # as the control plane
    channel: grpc.Channel
    gateway: pb_grpc.FunctionRuntimeStub  # as a gateway
    pki: TestPKI

    @property
    def work_root(self) -> Path:
        return self.runtime.work_root

    def signed(self, run: pb.RunRef) -> pb.SignedAssignment:
        """The control plane's assignment of `run` to this host."""
        return self.pki.sign(
            run_uid=run.run_uid,
            attempt=run.attempt,
            host_id=self.runtime.options.host_id,
            host_uid=self.runtime.host_uid,
            namespace=run.namespace,
            name=run.name,
            runtime=run.runtime,
        )

    def register_request(self, run: pb.RunRef, config: pb.FunctionConfig) -> pb.RegisterFunctionRequest:
        return pb.RegisterFunctionRequest(run=run, config=config, assignment=self.signed(run))

    def register(
        self,
        source: str | dict[str, str],
        *,
        handler: str = "main:handle",
        adapter: str = "python",
        uid: str | None = None,
        attempt: int = 1,
        env: dict[str, str] | None = None,
    ) -> pb.RegisterFunctionResponse:
        files = {"main.py": source} if isinstance(source, str) else source
        run = pb.RunRef(
            run_uid=uid or str(uuid.uuid4()),
            attempt=attempt,
            namespace="default",
            name="fn",
            runtime=self.runtime.options.runtime,
        )
        config = pb.FunctionConfig(adapter=adapter, handler=handler, env=env or {}, inline=inline(files))
        return self.stub.RegisterFunction(self.register_request(run, config))

    def invoke(
        self, registration_id: str, payload: bytes = b"{}", *, timeout_ms: int = 0, invocation_id: str = ""
    ) -> pb.InvokeFunctionResponse:
        return self.gateway.InvokeFunction(
            pb.InvokeFunctionRequest(
                registration_id=registration_id,
                payload=payload,
                timeout_ms=timeout_ms,
                invocation_id=invocation_id,
            )
        )

    def status(self, registration_id: str) -> pb.FunctionStatusResponse:
        return self.stub.FunctionStatus(pb.FunctionStatusRequest(registration_id=registration_id))


# The test hosts' bound on the size of a file a function process writes.
FILE_LIMIT = 16 * 1024 * 1024


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory every function of the module's host sees (functions run as their own uid in
    their own mount namespace: the tests' other files are invisible to them)."""
    path = tmp_path_factory.mktemp("shared")
    path.chmod(0o1777)
    return path


@pytest.fixture
def scratch(shared: Path) -> Path:
    """A fresh directory in `shared` for one test, writable by its functions."""
    path = shared / uuid.uuid4().hex[:12]
    path.mkdir()
    path.chmod(0o1777)
    return path


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module host's one allowed source root: `source.path` must lie under it."""
    return tmp_path_factory.mktemp("sources")


@pytest.fixture(scope="module")
def host(
    tmp_path_factory: pytest.TempPathFactory, pki: TestPKI, shared: Path, sources: Path
) -> Iterator[Host]:
    runtime = loopback_host(
        pki,
        tmp_path_factory.mktemp("host"),
        host_id="test-0",
        limits=ProcessLimits(file_size_bytes=FILE_LIMIT),
        sandbox=SandboxSettings(shared=(str(shared),)),
        allowed_source_roots=(str(sources),),
    )
    with serving(runtime, pki) as served:
        yield served


@contextlib.contextmanager
def krm_serving(
    tmp_path_factory: pytest.TempPathFactory,
    pki: TestPKI,
    shared: Path,
    *,
    host_id: str,
    krm_concurrency: int,
) -> Iterator[Host]:
    """A krm host taking `krm_concurrency` invocations at once, whose functions see `shared`:
    started, stopped after."""
    runtime = loopback_host(
        pki,
        tmp_path_factory.mktemp(host_id),
        host_id=host_id,
        runtime="krm",
        limits=ProcessLimits(file_size_bytes=FILE_LIMIT),
        sandbox=SandboxSettings(shared=(str(shared),)),
        krm_concurrency=krm_concurrency,
    )
    with serving(runtime, pki) as served:
        yield served


def register_krm(host: Host, body: str, env: dict[str, str] | None = None) -> str:
    """The registration id of `body` (main.py) registered as a krm function run by this Python,
    with `env` in its environment."""
    return host.register(body, adapter="krm", handler=f"{sys.executable} main.py", env=env).registration_id


@contextlib.contextmanager
def serving(runtime: RuntimeHost, pki: TestPKI) -> Iterator[Host]:
    """`runtime` started, with a control-plane and a gateway channel to it; stopped after."""
    address = runtime.start()
    channel = pki.channel(address, as_=pki.control_plane)
    gateway = pki.channel(address, as_=pki.gateway)
    try:
        yield Host(
            runtime, pb_grpc.FunctionRuntimeStub(channel), channel, pb_grpc.FunctionRuntimeStub(gateway), pki
        )
    finally:
        channel.close()
        gateway.close()
        runtime.stop(grace_s=1)


def reason(err: grpc.RpcError) -> str:
    return reason_of(err.trailing_metadata())  # type: ignore[arg-type]


def function_processes(uid: int) -> list[int]:
    """The live processes of a function, found by its uid (every function has its own; inside its
    PID namespace its own pids are not the host's)."""
    return processes_of(uid)


IDENTITY = "import os\ndef handle(p):\n    return {'uid': os.getuid(), 'pid': os.getpid()}\n"


def function_gone(identity: dict[str, int]) -> bool:
    """Whether nothing of the function that answered `identity` (from IDENTITY) still runs: by its
    own uid when it has one, else by its pid (a host that does not switch uids has no namespaces
    of other uids to hide pids in)."""
    if identity["uid"] != os.geteuid():
        return function_processes(identity["uid"]) == []
    return not alive(identity["pid"])
