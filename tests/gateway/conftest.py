"""End-to-end fixtures: a real Gateway over real HTTPS on the session event loop, real runtime host
processes heartbeating to it, an HTTPS client trusting the suite's CA, and a log capture of the
whole suite (gateway records and host stderr alike) that must never contain a token.

Everything listens on 127.0.0.1 with ports picked at run time; every process started here is
stopped by its pid.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import ssl
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp
import grpc
import pytest

from kruntimes.gateway.auth import CachingAuthorizer, EmbeddedAuthorizer, RoleBindings, TokenFile
from kruntimes.gateway.bodies import ErrorBody, InvokeAnswer
from kruntimes.gateway.routes import Route
from kruntimes.gateway.server import Gateway
from kruntimes.pki.local import TlsFiles, ensure_tls
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.system.logs import JsonFormatter
from kruntimes.wire.headers import INVOCATION_ID as INVOCATION_HEADER
from kruntimes.wire.reasons import gateway_reason
from tests.support.pki import TestPKI
from tests.support.procs import Proc, descendants, kill
from tests.support.procs import same_alive as alive
from tests.support.stack import local_gateway_options
from tests.support.waiting import eventually

# Distinctive, per-run tokens: the log checks look for these exact strings.
ALICE = f"tok-secret-alice-{uuid.uuid4().hex}"  # bound to namespace "default"
BOB = f"tok-secret-bob-{uuid.uuid4().hex}"  # bound to namespace "other"
BOGUS = f"tok-secret-bogus-{uuid.uuid4().hex}"  # well-formed, in no token file
SECRETS = (ALICE, BOB, BOGUS)

# every run uid registered by the suite (the metrics text must name none of them)
REGISTERED: list[str] = []

HEARTBEAT_S = 0.2
ROUTE_WAIT_S = 10.0
HOST_START_S = 30.0
HOST_STOP_S = 10.0
REPO = Path(__file__).resolve().parents[2]


# -- log capture ---------------------------------------------------------------------------------


class LogCapture(logging.Handler):
    """Keeps every record formatted twice: as a plain line (message + traceback) and as the JSON
    line the processes write (which includes every `extra` field)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.plain = logging.Formatter("%(name)s %(levelname)s %(message)s")
        self.json = JsonFormatter()
        self.lines: list[str] = []
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.plain.format(record))
            self.lines.append(self.json.format(record))
            self.records.append(record)
        except Exception:
            self.handleError(record)


def leaked_tokens(texts: list[str]) -> list[str]:
    """Which of the suite's tokens (named by user, never shown) occur in any of `texts`."""
    return [token.split("-")[2] for token in SECRETS if any(token in text for text in texts)]


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gateway-e2e")


@pytest.fixture(scope="session", autouse=True)
def log_capture(session_dir: Path) -> Iterator[LogCapture]:
    handler = LogCapture()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    # Torn down last (autouse, session): the gateway and every host have stopped by now.
    host_logs = [p.read_text(errors="replace") for p in sorted((session_dir / "logs").glob("*.log"))]
    assert handler.lines, "the log capture saw nothing"
    assert any('"run_uid"' in line for line in handler.lines), "no invoke access log was captured"
    leaked = leaked_tokens(handler.lines)
    assert not leaked, f"tokens of {leaked} appear in the gateway's log records"
    leaked = leaked_tokens(host_logs)
    assert not leaked, f"tokens of {leaked} appear in a host's stderr log"


# -- TLS, tokens, the gateway -------------------------------------------------------------------


@pytest.fixture(scope="session")
def tls(session_dir: Path) -> TlsFiles:
    return ensure_tls(session_dir / "tls")


@pytest.fixture(scope="session")
def auth_files(session_dir: Path) -> tuple[Path, Path]:
    tokens = session_dir / "tokens.csv"
    fd = os.open(tokens, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f'{ALICE},alice,1001,"devs"\n{BOB},bob,1002,"ops"\n')
    bindings = session_dir / "bindings.yaml"
    bindings.write_text(
        "bindings:\n  - namespace: default\n    users: [alice]\n  - namespace: other\n    users: [bob]\n"
    )
    return tokens, bindings


@pytest.fixture(scope="session")
async def gateway(tls: TlsFiles, auth_files: tuple[Path, Path], pki: TestPKI) -> AsyncIterator[Gateway]:
    tokens, bindings = auth_files
    authorizer = CachingAuthorizer(EmbeddedAuthorizer(TokenFile(tokens), RoleBindings.load(bindings)))
    gw = Gateway(
        local_gateway_options(
            tls,
            authorizer=authorizer,
            peer_tls=pki.gateway,
            assignments=pki.verifier(),
        )
    )
    try:
        await gw.start()
        yield gw
    finally:
        await gw.stop()


@pytest.fixture(scope="session")
async def client(tls: TlsFiles) -> AsyncIterator[aiohttp.ClientSession]:
    context = ssl.create_default_context(cafile=str(tls.ca_cert))
    connector = aiohttp.TCPConnector(ssl=context, limit=200)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


# -- answers ------------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    sent: dict[str, str] = field(default_factory=dict)  # the request's headers as sent

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def reason(self) -> str:
        return str(self.json["reason"])

    def expect(self, status: int, reason: str | None = None) -> Answer:
        """`status` with a JSON body as its model describes it (bodies.InvokeAnswer for a 200,
        bodies.ErrorBody else); errors carry `reason`, catalogued under `status`; the invocation
        id is in body and header."""
        assert self.status == status, f"expected {status}, got {self.status}: {self.body[:500]!r}"
        assert self.headers.get("Content-Type", "").startswith("application/json")
        if status == 200:
            InvokeAnswer.model_validate_json(self.body)
        else:
            ErrorBody.model_validate_json(self.body)
        doc = self.json
        assert isinstance(doc, dict)
        if reason is not None:
            assert doc.get("reason") == reason, doc
            catalogued = gateway_reason(reason)
            assert catalogued is not None and catalogued.status == status, (reason, status)
        assert doc.get("invocationId"), doc
        assert self.headers.get(INVOCATION_HEADER) == doc["invocationId"]
        return self


def invoke_url(gw: Gateway, uid: str, *, namespace: str = "default", runtime: str = "python") -> str:
    return f"{gw.url}/v1/namespaces/{namespace}/runtimes/{runtime}/functions/{uid}:invoke"


async def invoke(
    client: aiohttp.ClientSession,
    gw: Gateway,
    uid: str,
    body: Any = b"{}",
    *,
    token: str | None = ALICE,
    namespace: str = "default",
    runtime: str = "python",
    headers: dict[str, str] | None = None,
) -> Answer:
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    if isinstance(body, dict | list):
        body = json.dumps(body).encode()
    url = invoke_url(gw, uid, namespace=namespace, runtime=runtime)
    async with client.post(url, data=body, headers=sent) as response:
        return Answer(
            response.status,
            dict(response.headers),
            await response.read(),
            dict(response.request_info.headers),
        )


async def wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = ROUTE_WAIT_S) -> float:
    """Poll `predicate` until it holds (bounded); returns the seconds it took."""
    started = time.monotonic()
    await eventually(predicate, within=timeout_s, what=what)
    return time.monotonic() - started


async def wait_route(gw: Gateway, uid: str, *, ready: bool = True, host_uid: str | None = None) -> Route:
    def ok() -> bool:
        route = gw.routes.route(uid)
        return route is not None and route.ready is ready and (host_uid is None or route.host_uid == host_uid)

    await wait_for(ok, f"route of {uid} (ready={ready})")
    route = gw.routes.route(uid)
    assert route is not None
    return route


# -- host processes -----------------------------------------------------------------------------


@dataclass
class Function:
    uid: str
    registration_id: str
    host: HostProcess
    namespace: str = "default"
    runtime: str = "python"


@dataclass
class HostProcess:
    host_id: str
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    pki: TestPKI
    address: str = ""
    host_uid: str = ""
    channel: grpc.aio.Channel | None = None
    children: set[Proc] = field(default_factory=set)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def stub(self) -> pb_grpc.FunctionRuntimeAsyncStub:
        """The host's FunctionRuntime as the control plane calls it."""
        if self.channel is None:
            self.channel = self.pki.aio_channel(self.address, as_=self.pki.control_plane)
        return pb_grpc.FunctionRuntimeStub(self.channel)

    def signed(
        self, uid: str, *, attempt: int = 1, namespace: str = "default", name: str = "fn"
    ) -> pb.SignedAssignment:
        return self.pki.sign(
            run_uid=uid,
            attempt=attempt,
            host_id=self.host_id,
            host_uid=self.host_uid,
            namespace=namespace,
            name=name,
        )

    async def register(
        self,
        gw: Gateway,
        source: str | dict[str, str],
        *,
        handler: str = "main:handle",
        env: dict[str, str] | None = None,
        uid: str | None = None,
        attempt: int = 1,
        namespace: str = "default",
        name: str = "fn",
        wait: bool = True,
        concurrency: int = 0,
        queue: int = 0,
        queue_timeout_ms: int = 0,
        assignment: pb.SignedAssignment | None = None,
    ) -> Function:
        """Register a python function on this host over gRPC and wait for the gateway's route
        (`concurrency`, `queue`, `queue_timeout_ms`: 0 for the host's defaults; `assignment`: one
        signed by the caller, a Function's replica's, instead of the Run's plain one)."""
        files = {"main.py": source} if isinstance(source, str) else source
        uid = uid or str(uuid.uuid4())
        REGISTERED.append(uid)
        answer = await self.stub.RegisterFunction(
            pb.RegisterFunctionRequest(
                run=pb.RunRef(run_uid=uid, attempt=attempt, namespace=namespace, name=name, runtime="python"),
                assignment=assignment
                if assignment is not None
                else self.signed(uid, attempt=attempt, namespace=namespace, name=name),
                config=pb.FunctionConfig(
                    adapter="python",
                    handler=handler,
                    env=env or {},
                    inline=pb.InlineSource(
                        files=[
                            pb.InlineFile(name=n, content=textwrap.dedent(text).encode())
                            for n, text in files.items()
                        ]
                    ),
                    concurrency=concurrency,
                    queue=queue,
                    queue_timeout_ms=queue_timeout_ms,
                ),
            ),
            timeout=30,
        )
        if wait:
            await wait_route(gw, uid, host_uid=self.host_uid)
        return Function(uid, answer.registration_id, self, namespace)

    def signal(self, sig: signal.Signals) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, sig)

    async def exited(self, timeout_s: float) -> bool:
        with contextlib.suppress(AssertionError):
            await wait_for(lambda: self.proc.poll() is not None, f"host {self.host_id} to exit", timeout_s)
        return self.proc.poll() is not None

    async def stop(self) -> None:
        """SIGTERM (SIGKILL if it lingers), then check its zygote and function processes are gone."""
        self.children |= descendants(self.pid)
        if self.channel is not None:
            await self.channel.close()
            self.channel = None
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGTERM)
            if not await self.exited(HOST_STOP_S):
                os.kill(self.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()
        leftovers = set(self.children)
        with contextlib.suppress(AssertionError):
            await wait_for(lambda: not any(alive(p) for p in leftovers), "the host's children", 5.0)
        lingering = [p for p in leftovers if alive(p)]
        for proc in lingering:
            kill(proc)
        pids = sorted(p.pid for p in lingering)
        assert not lingering, f"processes {pids} of host {self.host_id} outlived it"


class Hosts:
    """Starts host processes heartbeating to the gateway; stops them all at the end (of its
    `async with`)."""

    def __init__(self, gw: Gateway, root: Path, pki: TestPKI) -> None:
        self.gw = gw
        self.root = root
        self.pki = pki
        self.started: list[HostProcess] = []
        (root / "logs").mkdir(exist_ok=True)
        (root / "records").mkdir(exist_ok=True)  # shared with the functions: see records_dir
        (root / "records").chmod(0o1777)

    async def start(
        self, host_id: str, *, interval_s: float = HEARTBEAT_S, args: tuple[str, ...] = ()
    ) -> HostProcess:
        """`args`: more flags of `krt host`."""
        ready = self.root / f"{host_id}.ready.json"
        log = open(self.root / "logs" / f"{host_id}.log", "wb")  # noqa: SIM115 (closed in stop)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kruntimes.workers.host",
                "--host-id",
                host_id,
                "--runtime",
                "python",
                "--state-dir",
                str(self.root / host_id),
                "--ready-file",
                str(ready),
                "--gateway",
                self.gw.heartbeat_address,
                "--heartbeat-interval",
                str(interval_s),
                "--share",
                str(self.root / "records"),
                "--log-level",
                "debug",
                *self.pki.host_args(host_id),
                *args,
            ],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        host = HostProcess(host_id, proc, log, self.pki)
        self.started.append(host)
        await wait_for(
            lambda: ready.exists() or proc.poll() is not None, f"host {host_id} to start", HOST_START_S
        )
        assert proc.poll() is None, (
            f"host {host_id} exited: {(self.root / 'logs' / f'{host_id}.log').read_text()}"
        )
        info = json.loads(ready.read_text())
        assert info["pid"] == proc.pid
        host.address, host.host_uid = info["address"], info["hostUid"]
        await wait_for(lambda: self._heard(host), f"the first heartbeat of {host_id}")
        host.children = descendants(proc.pid)
        return host

    async def __aenter__(self) -> Hosts:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop_all()

    def _heard(self, host: HostProcess) -> bool:
        return host.host_uid in self.gw.routes._hosts  # (no public view of one host's entry)

    async def stop_all(self) -> None:
        errors = []
        for host in self.started:
            try:
                await host.stop()
            except AssertionError as exc:
                errors.append(str(exc))
        assert not errors, errors


@pytest.fixture(scope="session")
async def hosts(gateway: Gateway, session_dir: Path, pki: TestPKI) -> AsyncIterator[Hosts]:
    async with Hosts(gateway, session_dir, pki) as started:
        yield started


@pytest.fixture(scope="session")
async def main_host(hosts: Hosts) -> HostProcess:
    return await hosts.start("gw-main")


@pytest.fixture(scope="session")
async def echo(gateway: Gateway, main_host: HostProcess) -> Function:
    """Returns its payload (a dict as the outputs, anything else under "result")."""
    return await main_host.register(
        gateway,
        """
        import sys

        def handle(payload):
            print("echo", file=sys.stderr)
            return payload
        """,
    )


@pytest.fixture(scope="session")
def records_dir(session_dir: Path) -> Path:
    """Where functions write what they did: shared with every host's functions (they run as
    their own uid in mount namespaces of their own, which show them nothing else of the tests)."""
    path = session_dir / "records"
    path.mkdir(exist_ok=True)
    path.chmod(0o1777)
    return path


async def recording(
    host: HostProcess, gateway: Gateway, records_dir: Path, source: str
) -> tuple[Path, Function]:
    """`source` registered on `host` with TEST_RECORD naming a new file, where it writes one line
    per invocation that reached it; the file and the function."""
    path = records_dir / f"{uuid.uuid4().hex}.txt"
    return path, await host.register(gateway, source, env={"TEST_RECORD": str(path)})


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []
