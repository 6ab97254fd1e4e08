"""Assembly of one runtime host: zygote, registry, tasks, gRPC server with the health service.

A synchronous gRPC server is used on purpose: each invocation blocks a worker thread on a pipe
to its function process, and the sync server costs ~35% less CPU per call than grpc.aio here
(bench/runtime_server.py measures both against an echo baseline).
"""

from __future__ import annotations

import gc
import logging
import shutil
import uuid
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kruntimes.api.limits import MAX_PAYLOAD_BYTES
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from runtime.heartbeat import HeartbeatSender
from runtime.invoke import InvokeListener, handle_invoke
from runtime.limits import ProcessLimits
from runtime.registry import Registry
from runtime.service import FunctionRuntimeService, registration_state
from runtime.spawner import Spawner
from runtime.tasks import Tasks

log = logging.getLogger(__name__)

SERVICE_NAME = "kruntimes.rpc.v1.FunctionRuntime"
MAX_MESSAGE_BYTES = MAX_PAYLOAD_BYTES + 512 * 1024  # payload or inline source plus envelope


@dataclass(frozen=True)
class HostOptions:
    host_id: str
    runtime: str
    listen: str  # "127.0.0.1:0" picks a free port
    state_dir: Path
    limits: ProcessLimits = field(default_factory=ProcessLimits)
    max_workers: int = 64
    gateways: tuple[str, ...] = ()  # where heartbeats go (the gateways' heartbeat addresses)
    heartbeat_interval_s: float = 5.0
    # the raw invoke port (runtime/invoke.py); None: the host of `listen`, port 0; "" disables it
    invoke_listen: str | None = None


class RuntimeHost:
    def __init__(self, options: HostOptions) -> None:
        self.options = options
        self.host_uid = str(uuid.uuid4())
        self.work_root = options.state_dir / "work" / self.host_uid
        self.spawner = Spawner()
        self.registry = Registry(
            spawner=self.spawner,
            work_root=self.work_root,
            limits=options.limits,
            host_uid=self.host_uid,
            on_change=self._registrations_changed,
        )
        self.tasks = Tasks(spawner=self.spawner, work_root=self.work_root, limits=options.limits)
        self.health = health.HealthServicer()
        self.server: grpc.Server | None = None
        self.address = ""
        self.invoke_address = ""
        self.invoke_listener: InvokeListener | None = None
        self.heartbeats: HeartbeatSender | None = None

    def start(self) -> str:
        self.work_root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.spawner.start()
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.options.max_workers, thread_name_prefix="rpc"),
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
        )
        pb_grpc.add_FunctionRuntimeServicer_to_server(service, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        port = server.add_insecure_port(self.options.listen)
        if port == 0:
            raise OSError(f"cannot listen on {self.options.listen}")
        host = self.options.listen.rsplit(":", 1)[0]
        self.address = f"{host}:{port}"
        server.start()
        self.server = server
        invoke_listen = self.options.invoke_listen
        if invoke_listen is None:  # beside the gRPC port; a unix socket host gets none
            invoke_listen = "" if self.options.listen.startswith("unix:") else f"{host}:0"
        if invoke_listen:
            registry = self.registry
            self.invoke_listener = InvokeListener(
                lambda body: handle_invoke(registry, body),
                max_workers=self.options.max_workers,
                max_frame_bytes=MAX_MESSAGE_BYTES,
            )
            self.invoke_address = self.invoke_listener.start(invoke_listen)
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self.options.gateways:
            self.heartbeats = HeartbeatSender(
                gateways=list(self.options.gateways),
                host_id=self.options.host_id,
                host_uid=self.host_uid,
                runtime=self.options.runtime,
                address=self.address,
                invoke_address=self.invoke_address,
                interval_s=self.options.heartbeat_interval_s,
                snapshot=lambda: [registration_state(r) for r in self.registry.snapshot()],
            )
            self.heartbeats.start()
        gc.freeze()  # start-up objects never need collecting; keeps full collections short
        log.info(
            "runtime host serving",
            extra={"address": self.address, "invoke_address": self.invoke_address, "host_uid": self.host_uid},
        )
        return self.address

    def _registrations_changed(self) -> None:
        if self.heartbeats is not None:
            self.heartbeats.changed()

    def stop(self, grace_s: float = 5.0) -> None:
        self.health.enter_graceful_shutdown()
        if self.heartbeats is not None:
            self.heartbeats.stop()  # gateways drop this host's routes at once
        stopping = self.server.stop(grace_s) if self.server is not None else None
        if self.invoke_listener is not None:
            self.invoke_listener.stop(grace_s)
        if stopping is not None:
            stopping.wait()
        self.tasks.close()
        self.registry.close()
        self.spawner.close()
        shutil.rmtree(self.work_root, ignore_errors=True)

    def wait(self) -> None:
        if self.server is not None:
            self.server.wait_for_termination()
