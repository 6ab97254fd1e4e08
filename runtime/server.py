"""Assembly of one runtime host: zygote, registry, tasks, gRPC server with the health service.

Every port is mutual TLS with the host's platform certificate (`HostOptions.tls`, issued for
`host/<runtime>/<host-id>`): the gRPC server requires client certificates of the platform CA and
lets each role call only its methods (kruntimes.runtime.service.ALLOWED_ROLES), the invoke port accepts
only gateways, heartbeats go to gateways with the same certificate. Registering needs the control
plane's signed assignment (`HostOptions.assignments` holds its public key). A host without them
does not start.

One event loop (uvloop) serves everything on the invoke path: the grpc.aio server, the raw invoke
port and the exchange with each warm function process (readers on its socket and pipes), so an
invocation never hops threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Coroutine
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kruntimes.api.limits import MAX_PAYLOAD_BYTES
from kruntimes.config.secret_files import FileSecrets
from kruntimes.pki import Identity, IdentityError, PeerAuthorization, PeerTLS
from kruntimes.pki.assignments import Verifier
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.runtime.admission import DEFAULT_MAX_WAITING
from kruntimes.runtime.discovery import DEFAULT_INTERVAL_S, GatewayDiscovery
from kruntimes.runtime.heartbeat import HeartbeatSender
from kruntimes.runtime.invoke import InvokeListener
from kruntimes.runtime.isolation import MACHINE_SECRETS, FunctionIsolation
from kruntimes.runtime.launch import Launcher
from kruntimes.runtime.limits import ProcessLimits
from kruntimes.runtime.registry import DEFAULT_KRM_CONCURRENCY, Registry
from kruntimes.runtime.sandbox.policy import InForce, SandboxSettings
from kruntimes.runtime.secret_access import BINDINGS_FILE, BindingsFile, SecretAccess
from kruntimes.runtime.service import (
    ALLOWED_ROLES,
    DEFAULT_ROLES,
    FunctionRuntimeService,
    RegistrationStates,
    isolation_message,
)
from kruntimes.runtime.spawner import Spawner
from kruntimes.runtime.tasks import Tasks
from kruntimes.runtime.watch import Health, HostWatch
from kruntimes.runtime.workspace import SourcePolicy

log = logging.getLogger(__name__)

SERVICE_NAME = "kruntimes.rpc.v1.FunctionRuntime"
MAX_MESSAGE_BYTES = MAX_PAYLOAD_BYTES + 512 * 1024  # payload or inline source plus envelope
START_TIMEOUT_S = 30.0
STOP_STEP_TIMEOUT_S = 10.0
WORKSPACE_REMOVAL_S = 2.0  # removing the workspaces again while killed processes let go
T = TypeVar("T")


@dataclass(frozen=True)
class HostOptions:
    host_id: str
    runtime: str
    listen: str  # "127.0.0.1:0" picks a free port
    state_dir: Path
    limits: ProcessLimits = field(default_factory=ProcessLimits)
    max_workers: int = 64  # threads for blocking work (spawning, workspaces, tasks, teardown)
    # where heartbeats go: gateways' heartbeat addresses, or dns+all://NAME:PORT (kruntimes.runtime.discovery)
    gateways: tuple[str, ...] = ()
    heartbeat_interval_s: float = 5.0
    gateway_resolve_interval_s: float = DEFAULT_INTERVAL_S  # how often such names are resolved again
    # the raw invoke port (runtime/invoke.py); None: the host of `listen`, port 0; "" disables it
    invoke_listen: str | None = None
    # how functions are isolated (runtime/sandbox/policy.py); a uid per function by default.
    # None: no isolation beyond the rlimits, for benchmarks that measure what isolation costs
    # (no flag of `krt host` gives it)
    sandbox: SandboxSettings | None = field(default_factory=SandboxSettings)
    # where a Run's source.path may point; none: only inline sources (the state directory and
    # the hidden directories are refused wherever the roots are)
    allowed_source_roots: tuple[str, ...] = ()
    # the secrets a Run's envFrom names (kruntimes/config/secret_files.py); None: `{state_dir}/secrets`
    secrets_dir: Path | None = None
    # who may use which namespace's secrets (kruntimes.config.bindings, `use-secrets`), read again
    # when it changes; None: `{state_dir}/rolebindings.yaml`. Missing: no Run gets a secret.
    role_bindings: Path | None = None
    # function identities (uid, cgroup, a sandboxed child planted in the zygote) kept ready
    # for the next registrations
    seeds: int = 2
    # the host's platform certificate directory and the control plane's assignment public key:
    # required, the host serves no port without them
    tls: PeerTLS | None = None
    assignments: Verifier | None = None
    # False serves the invoke port without TLS: only for the invoke bench's plaintext baseline
    # (bench/invoke.py), never reachable from `krt host`
    invoke_tls: bool = True
    # The host's incarnation id; None: a fresh UUID. A pod passes its own uid (the kubernetes provider).
    host_uid: str | None = None
    # A plaintext port that serves only grpc.health.v1 (SERVING or not, nothing else): for
    # probes that cannot present a certificate, such as a kubelet's gRPC readiness probe.
    # None: no such port.
    health_listen: str | None = None
    # how many invocations a krm registration takes at once (each its own one-shot process)
    krm_concurrency: int = DEFAULT_KRM_CONCURRENCY
    # invocations running at once across the host's registrations (past it: HostBusy); None:
    # sized to the host's CPUs and memory (kruntimes.runtime.admission.default_max_invocations)
    max_invocations: int | None = None
    # invocations waiting their turn across the host's registrations, and the bytes they hold
    # (past either: HostBusy); None bytes: a share of the host's memory
    # (kruntimes.runtime.admission.default_max_waiting_bytes)
    max_waiting: int = DEFAULT_MAX_WAITING
    max_waiting_bytes: int | None = None
    # the calls of a function that starts a process per call (bash, krm) run in lanes of its
    # sandbox (runtime/lanes.py) where it has a PID namespace; False: each call started by the
    # zygote (for comparisons)
    lanes: bool = True


class HostConfigError(Exception):
    """The host cannot start as configured (e.g. without its certificate)."""


def _check_trust(options: HostOptions) -> tuple[PeerTLS, Verifier]:
    if options.tls is None or options.assignments is None:
        raise HostConfigError("a runtime host needs its platform certificate and the assignment public key")
    try:
        expected = Identity.host(runtime=options.runtime, host_id=options.host_id)
    except IdentityError as e:
        raise HostConfigError(f"the host id and runtime must be DNS-1123 labels: {e}") from e
    if options.tls.identity != expected:
        raise HostConfigError(f"the host's certificate names {options.tls.identity}, not {expected}")
    return options.tls, options.assignments


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when importable (it is a dependency on POSIX), else the standard loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class RuntimeHost:
    """A runtime host. `start`/`stop` block the caller; the serving happens on one event loop in a
    thread of its own: the grpc.aio server, the invoke port and every exchange with a warm function
    process. Blocking work (spawning, workspaces, tasks, teardown) goes to the loop's executor."""

    def __init__(self, options: HostOptions) -> None:
        self.options = options
        self.tls, self.assignments = _check_trust(options)
        self.host_uid = str(uuid.UUID(options.host_uid)) if options.host_uid else str(uuid.uuid4())
        self.work_root = options.state_dir / "work" / self.host_uid
        self.spawner = Spawner()
        self.isolation = (
            FunctionIsolation(
                options.sandbox, host_uid=self.host_uid, hide=(str(options.state_dir), str(self.work_root))
            )
            if options.sandbox is not None
            else None
        )
        self.in_force: InForce | None = None
        hidden = options.sandbox.hide if options.sandbox is not None else ()
        sources = SourcePolicy(
            allowed_roots=options.allowed_source_roots,
            forbidden=(str(options.state_dir), *hidden, *MACHINE_SECRETS),
        )
        secrets = SecretAccess(
            FileSecrets(options.secrets_dir or options.state_dir / "secrets"),
            BindingsFile(options.role_bindings or options.state_dir / BINDINGS_FILE),
        )
        launcher = Launcher(
            spawner=self.spawner,
            work_root=self.work_root,
            limits=options.limits,
            isolation=self.isolation,
            sources=sources,
            secrets=secrets,
        )
        self.registry = Registry(
            launcher=launcher,
            host_uid=self.host_uid,
            on_change=self._registrations_changed,
            krm_concurrency=options.krm_concurrency,
            lanes=options.lanes,
            max_invocations=options.max_invocations,
            max_waiting=options.max_waiting,
            max_waiting_bytes=options.max_waiting_bytes,
        )
        self.states = RegistrationStates(self.registry)  # what the watch and the heartbeats report
        self.tasks = Tasks(launcher=launcher)
        self.health = health.aio.HealthServicer()
        self.server: grpc.aio.Server | None = None
        self.address = ""
        self.invoke_address = ""
        self.invoke_listener: InvokeListener | None = None
        self.health_server: grpc.aio.Server | None = None
        self.health_address: str | None = None
        self.heartbeats: HeartbeatSender | None = None
        self.watch = HostWatch(
            host_id=options.host_id,
            host_uid=self.host_uid,
            runtime=options.runtime,
            interval_s=options.heartbeat_interval_s,
            registrations=self.states,
            running_tasks=self.tasks.running,
            isolation=self._isolation,
            gateways=self._gateway_links,
            set_gateways=self._set_gateways,
            health=Health(),
            invocations=self._invocations,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._executor: futures.ThreadPoolExecutor | None = None

    def _run(self, work: Coroutine[Any, Any, T], timeout_s: float) -> T:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout_s)

    def start(self) -> str:
        """Start serving; IsolationUnavailable when the functions cannot be isolated as asked."""
        if self.isolation is not None:
            self.isolation.check()
        self.work_root.mkdir(parents=True, exist_ok=True)
        self.work_root.chmod(0o711)  # enterable, not listable: each workspace is its function's own
        self.spawner.start()
        try:
            if self.isolation is not None:
                self.in_force = self.isolation.start(
                    namespaces=self.spawner.namespaces,
                    network_namespaces=self.spawner.network_namespaces,
                    work_root=self.work_root,
                )
                # identities made ahead of demand, each with a seed in its own cgroup where
                # there are cgroups; generic seeds (joining their cgroup when given) otherwise
                self.isolation.prepare(count=self.options.seeds, plant=self.spawner.plant)
                base = self.isolation.seed_base()
                if base is not None and self.options.seeds > 0 and not self.isolation.plants_seeds:
                    self.spawner.configure_seeds(base, count=self.options.seeds)
        except BaseException:
            self.spawner.close()
            if self.isolation is not None:
                self.isolation.close()  # the identities made ahead of demand
            raise
        loop = new_event_loop()
        self._executor = futures.ThreadPoolExecutor(
            max_workers=self.options.max_workers, thread_name_prefix="rpc"
        )
        loop.set_default_executor(self._executor)
        self._loop = loop
        self.watch.bind(loop)
        self._thread = threading.Thread(target=loop.run_forever, name="runtime-loop", daemon=True)
        self._thread.start()
        try:
            self._run(self._serve(), START_TIMEOUT_S)
        except BaseException:
            with contextlib.suppress(Exception):  # whatever started before the failure
                self._run(self._stop_serving(0.0), STOP_STEP_TIMEOUT_S)
            self._stop_loop()
            self.spawner.close()
            if self.isolation is not None:
                self.isolation.close()
            raise
        # Always made, also without gateways: the supervision stream may name them later.
        self.heartbeats = HeartbeatSender(
            gateways=list(self.options.gateways),
            host_id=self.options.host_id,
            host_uid=self.host_uid,
            runtime=self.options.runtime,
            address=self.address,
            invoke_address=self.invoke_address,
            interval_s=self.options.heartbeat_interval_s,
            tls=self.tls,
            snapshot=self.states,
            isolation=isolation_message(self.in_force) if self.in_force is not None else None,
            discovery=GatewayDiscovery(interval_s=self.options.gateway_resolve_interval_s),
        )
        self.heartbeats.start()
        gc.freeze()  # start-up objects never need collecting; keeps full collections short
        log.info(
            "runtime host serving",
            extra={"address": self.address, "invoke_address": self.invoke_address, "host_uid": self.host_uid},
        )
        return self.address

    async def _serve(self) -> None:
        server = grpc.aio.server(
            interceptors=[PeerAuthorization(ALLOWED_ROLES, default=DEFAULT_ROLES)],
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ],
        )
        service = FunctionRuntimeService(
            registry=self.registry,
            tasks=self.tasks,
            host_id=self.options.host_id,
            runtime=self.options.runtime,
            isolation=isolation_message(self.in_force) if self.in_force is not None else None,
            assignments=self.assignments,
            watch=self.watch,
        )
        pb_grpc.add_FunctionRuntimeServicer_to_server(service, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        port = server.add_secure_port(self.options.listen, self.tls.server_credentials())
        if port == 0:
            raise OSError(f"cannot listen on {self.options.listen}")
        host = self.options.listen.rsplit(":", 1)[0]
        self.address = f"{host}:{port}"
        await server.start()
        self.server = server
        invoke_listen = self.options.invoke_listen
        if invoke_listen is None:  # beside the gRPC port; a unix socket host gets none
            invoke_listen = "" if self.options.listen.startswith("unix:") else f"{host}:0"
        if invoke_listen:
            self.invoke_listener = InvokeListener(
                self.registry,
                tls=self.tls if self.options.invoke_tls else None,
                max_frame_bytes=MAX_MESSAGE_BYTES,
            )
            self.invoke_address = await self.invoke_listener.start(invoke_listen)
        if self.options.health_listen:
            await self._serve_health(self.options.health_listen)
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def _serve_health(self, listen: str) -> None:
        """The plaintext health port: Health/Check alone (no Watch, whose streams stay open),
        small messages, few streams per connection, idle connections closed."""
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", 1024),
                ("grpc.max_send_message_length", 1024),
                ("grpc.max_concurrent_streams", 4),
                ("grpc.max_connection_idle_ms", 30_000),
                ("grpc.so_reuseport", 0),
            ],
        )
        check = grpc.unary_unary_rpc_method_handler(
            self.health.Check,
            request_deserializer=health_pb2.HealthCheckRequest.FromString,
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("grpc.health.v1.Health", {"Check": check}),)
        )
        port = server.add_insecure_port(listen)
        if port == 0:
            raise OSError(f"cannot listen on {listen}")
        self.health_address = f"{listen.rsplit(':', 1)[0]}:{port}"
        await server.start()
        self.health_server = server

    def _registrations_changed(self) -> None:
        if self.heartbeats is not None:
            self.heartbeats.changed()
        self.watch.changed()

    def _invocations(self) -> tuple[int, int]:
        bound = self.registry.bound
        return bound.running, bound.limit

    def _gateway_links(self) -> list[pb.GatewayLink]:
        links = self.heartbeats.links() if self.heartbeats is not None else []
        return [pb.GatewayLink(address=address, connected=connected) for address, connected in links]

    def _set_gateways(self, gateways: list[str]) -> None:
        if self.heartbeats is not None and gateways != self.heartbeats.gateways:
            log.info("heartbeat gateways changed", extra={"gateways": gateways})
            self.heartbeats.set_gateways(gateways)

    def _isolation(self) -> dict[str, str]:
        """How function processes are isolated here, for the supervision stream."""
        facts = {"processGroup": "own session and process group, killed with the host"}
        if self.in_force is not None:  # what is in force, as the heartbeat and krt status say it
            isolation = isolation_message(self.in_force)
            facts.update(
                {
                    "isolation": isolation.isolation,
                    "network": isolation.network,
                    "pidNamespace": str(isolation.pid_namespace).lower(),
                    "mountNamespace": str(isolation.mount_namespace).lower(),
                    "cgroup": isolation.cgroup,
                    "summary": isolation.summary,
                }
            )
        facts.update({f"limit.{name}": str(value) for name, value in self.options.limits.to_dict().items()})
        return facts

    def stop(self, grace_s: float = 5.0) -> None:
        self.watch.stop_serving("the host is stopping")
        if self._loop is not None:
            try:
                self._run(self.health.enter_graceful_shutdown(), STOP_STEP_TIMEOUT_S)
            except Exception:
                log.warning("health service did not enter graceful shutdown", exc_info=True)
        if self.heartbeats is not None:
            self.heartbeats.stop()  # gateways drop this host's routes at once
        if self._loop is not None:
            try:
                self._run(self._stop_serving(grace_s), grace_s + STOP_STEP_TIMEOUT_S)
            except Exception:
                log.warning("the servers did not stop cleanly", exc_info=True)
        # the loop still runs: in-flight exchanges end when their processes are killed
        self.tasks.close()
        self.registry.close()
        self._stop_loop()
        self.spawner.close()
        if self.isolation is not None:
            self.isolation.close()
        # A function process being killed can still create a file while the tree is removed
        # (rmtree then leaves a directory it could not empty): remove again until it is gone,
        # for a bounded time.
        deadline = time.monotonic() + WORKSPACE_REMOVAL_S
        shutil.rmtree(self.work_root, ignore_errors=True)
        while self.work_root.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
            shutil.rmtree(self.work_root, ignore_errors=True)
        if self.work_root.exists():
            log.warning("the host's workspaces could not all be removed", extra={"path": str(self.work_root)})

    async def _stop_serving(self, grace_s: float) -> None:
        stopping = []
        if self.server is not None:
            stopping.append(self.server.stop(grace_s))
        if self.invoke_listener is not None:
            stopping.append(self.invoke_listener.stop(grace_s))
        if self.health_server is not None:
            stopping.append(self.health_server.stop(0))
        await asyncio.gather(*stopping)

    def _stop_loop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(Exception):
            self._run(self.registry.drain(), STOP_STEP_TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(STOP_STEP_TIMEOUT_S)
        if not thread.is_alive():
            loop.close()
        self._loop = None
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
