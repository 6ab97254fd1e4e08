"""A test cluster: kmock's Kubernetes emulator with what it leaves out scripted, and a test kubelet.

``Cluster`` (a KubernetesEmulator) adds what the kubernetes provider relies on and kmock does not
emulate: uids, creationTimestamps and resourceVersions on pods (uids and the delete's uid
precondition on Secrets too, and the garbage collection of Secrets a deleted pod owned) (lists answer the current version,
watches skip what the given version already covers, a watch from a version below ``gone_below``
gets 410 Gone), the uid precondition of a delete (409 when it does not match), graceful deletion
of a pod bound to a node (deletionTimestamp, then the kubelet's final delete; a pod that ended
is deleted at once, as the API server does), and an admission
chain: scripted refusals of pod creates (quota 403, RBAC 403, admission 422, 503) that store
nothing, and, where the kubelet cannot give pods network namespaces (not root), ports of their
own for every pod (all pods share 127.0.0.1 then: the ports named in the host container, its
KRT_*_PORT env and its gRPC readiness probe are moved to ports held for it, as a mutating webhook
could).
Selectors and PUT are not emulated: the provider filters what it lists itself and never PUTs.

``TestKubelet`` watches pods through the API like a kubelet, binds them to its node, starts a real
`krt host` process for each (its init containers' processes first, each to its end; the pod's
command and args with $(VAR) expanded from the pod's env, the downward API filled in, labels and
annotations included), probes its gRPC health as the readiness probe says and patches the pod's
status (podIP: its sandbox's address, or 127.0.0.1; phase, conditions, containerStatuses), reports the process's exit, and on
deletion stops the process (SIGTERM, SIGKILL after the grace period) and deletes the pod for
good. Volumes are directories of the pod on the node; a secret or configMap volume is written there
once its Secret or ConfigMap exists, in the kubelet's atomic-writer layout (each key, or each of its
`items` at its path, a link through `..data` to a timestamped directory, swapped at once when the
object changes, which it follows while the pod runs).

As root, every pod gets a sandbox of its own (podnet.py): a network namespace with an address of
its own on a veth pair (its podIP; its ports are not moved), and for a pod of ``hostUsers:
false`` a user namespace mapping a range of the node's uids no other pod has, which owns that
network namespace; its containers join them.

As root (``can_contain``), each container runs as a node runs it (container.py): as PID 1 of PID,
mount, IPC and UTS namespaces of its own, on a root of its own with the volumes at their mount
paths, and with the container's security context applied — a read-only root file system,
capabilities, no_new_privs, uid and gid (a pod that asks for none runs with the kubelet's
privileges, a leniency of this node). Otherwise processes run on the node's file system, volume
mount paths in their args mapped to the pod's directories. Told to, it fails pods:
ImagePullBackOff, Unschedulable, a crash (the process SIGKILLed), CrashLoopBackOff, eviction, an
init container that fails (`krt install-host` given a bundle that does not exist).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import datetime
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import attrs
import grpc
from grpc_health.v1 import health_pb2
from kmock import KubernetesEmulator, ResourceInfo, Server, action

from tests.kubernetes import podnet

POD_IP = "127.0.0.1"
INIT_TIMEOUT_S = 60.0  # how long one init container may run
NODE = "test-node"
CONTAINER_RUNTIME = Path(__file__).with_name("container.py")
PID_FILE_WAIT_S = 60.0  # a hang guard: a loaded node starts a contained process slowly
SECRET_SYNC_S = 0.5  # how often a running pod's secret volumes follow their Secrets
_HEALTH = "/grpc.health.v1.Health/Check"


def now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def held_port(held: list[socket.socket]) -> int:
    """A port of the kernel's choosing, kept bound in `held` (SO_REUSEADDR, never listening) until
    the cluster ends: the pod's own server binds it too (its listeners set SO_REUSEADDR) and
    listens, while no other process can take it between the pod's create and its start."""
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
    except OSError:
        sock.close()
        raise
    held.append(sock)
    return int(sock.getsockname()[1])


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


@dataclass(frozen=True)
class Refusal:
    """A scripted answer to pod creates of one runtime (or of every runtime, with None)."""

    runtime: str | None
    status: int
    reason: str
    message: str
    times: int | None = None  # None: every create


@attrs.define(kw_only=True)
class Cluster(KubernetesEmulator):
    version: int = 0
    gone_below: int = 0
    refusals: list[Refusal] = attrs.field(factory=list)
    refused: list[dict[str, Any]] = attrs.field(factory=list)  # the pods refused, as sent
    collect_garbage: bool = True  # False: a deleted pod leaves the Secrets it owned behind
    # Set: a pod create is stored at once but answered only once this is set (a slow reply).
    create_replies: asyncio.Event | None = None
    _watchers: set[Any] = attrs.field(factory=set, init=False)  # the open watch requests
    _held: list[socket.socket] = attrs.field(factory=list, init=False)  # the pods' ports (held_port)
    # Pods get network namespaces of their own (the kubelet contains them): their ports stay as
    # the pod says.
    pod_networks: bool = False

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # Known before any pod exists, so an empty list is an empty list, not 404.
        self.resources["v1/pods"] = ResourceInfo(kind="Pod", namespaced=True)
        self.resources["v1/secrets"] = ResourceInfo(kind="Secret", namespaced=True)
        self.resources["v1/configmaps"] = ResourceInfo(kind="ConfigMap", namespaced=True)

    # -- scripting -----------------------------------------------------------------------------------

    def refuse(
        self, *, runtime: str | None, status: int, reason: str, message: str, times: int | None = None
    ):
        self.refusals.append(Refusal(runtime, status, reason, message, times))

    def pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """The pods stored now (not deleted)."""
        found = []
        for (resource, ns, _name), obj in list(self._objects.items()):
            if resource.plural == "pods" and not obj.deleted and (namespace is None or ns == namespace):
                found.append(obj.raw)
        return found

    def release_ports(self) -> None:
        """Let go of the ports held for pods (once their processes are stopped)."""
        while self._held:
            self._held.pop().close()

    def drop_watches(self) -> None:
        """Cut every open watch connection, as a load balancer or a restarted API server would."""
        for request in list(self._watchers):
            raw = request._raw_request
            if raw is not None and raw.transport is not None:
                raw.transport.close()

    def _next_version(self) -> str:
        self.version += 1
        return str(self.version)

    # -- the API ---------------------------------------------------------------------------------------

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        resource = request.resource
        if resource is not None and resource.plural == "pods" and resource.group == "":
            answer = await self._pods(request)
            if answer is not None:
                return answer
            if request.action == action.CREATE and self.create_replies is not None:
                stored = await super()._handle(request)
                await self.create_replies.wait()
                return stored
        if resource is not None and resource.plural == "secrets" and resource.group == "":
            answer = await self._secrets(request)
            if answer is not None:
                return answer
        return await super()._handle(request)

    def secret(self, namespace: str, name: str, *, plural: str = "secrets") -> dict[str, Any] | None:
        """The Secret (or the object of another `plural`) stored now, or None."""
        for (resource, ns, obj_name), obj in list(self._objects.items()):
            if resource.plural == plural and ns == namespace and obj_name == name and not obj.deleted:
                return dict(obj.raw)
        return None

    def secrets(self, namespace: str) -> list[dict[str, Any]]:
        return [
            obj.raw
            for (resource, ns, _name), obj in list(self._objects.items())
            if resource.plural == "secrets" and ns == namespace and not obj.deleted
        ]

    async def _secrets(self, request: Any) -> aiohttp.web.StreamResponse | None:
        """uids on Secrets and the uid precondition of their deletes (kmock has neither)."""
        if request.action == action.CREATE and isinstance(request.data, dict):
            metadata = request.data.setdefault("metadata", {})
            metadata["uid"] = str(uuid.uuid4())
            metadata["creationTimestamp"] = now()
            return None
        if request.action != action.DELETE or request.name is None:
            return None
        current = self.secret(request.namespace, request.name)
        options = request.data if isinstance(request.data, dict) else {}
        wanted_uid = (options.get("preconditions") or {}).get("uid")
        if current is not None and wanted_uid and wanted_uid != current["metadata"].get("uid"):
            message = f"Precondition failed: UID in precondition: {wanted_uid}"
            return aiohttp.web.json_response(status_body(409, "Conflict", message), status=409)
        return None

    def _collect_owned(self, pod: dict[str, Any]) -> None:
        """The garbage collector: a pod deleted for good takes the Secrets it owns with it."""
        if not self.collect_garbage:
            return
        uid = pod["metadata"].get("uid")
        for (resource, _ns, _name), obj in list(self._objects.items()):
            if resource.plural != "secrets" or obj.deleted:
                continue
            owners = (obj.raw.get("metadata") or {}).get("ownerReferences") or []
            if any(o.get("uid") == uid for o in owners):
                obj.delete()

    async def _pods(self, request: Any) -> aiohttp.web.StreamResponse | None:
        if request.action == action.CREATE and isinstance(request.data, dict):
            labels = (request.data.get("metadata") or {}).get("labels") or {}
            for i, refusal in enumerate(self.refusals):
                if refusal.runtime in (None, labels.get("kruntimes.io/runtime")):
                    if refusal.times is not None and refusal.times <= 1:
                        del self.refusals[i]
                    elif refusal.times is not None:
                        self.refusals[i] = dataclasses.replace(refusal, times=refusal.times - 1)
                    self.refused.append(request.data)
                    body = status_body(refusal.status, refusal.reason, refusal.message)
                    return aiohttp.web.json_response(body, status=refusal.status)
            metadata = request.data.setdefault("metadata", {})
            metadata["uid"] = str(uuid.uuid4())
            metadata["creationTimestamp"] = now()
            metadata["resourceVersion"] = self._next_version()
            request.data.setdefault("status", {"phase": "Pending"})
            if not self.pod_networks:
                _own_ports(request.data, self._held)
            return None
        if request.name is None:
            return None
        key = (request.resource, request.namespace, request.name)
        if request.action == action.UPDATE and isinstance(request.data, dict):
            request.data.setdefault("metadata", {})["resourceVersion"] = self._next_version()
            return None
        if request.action != action.DELETE:
            return None
        async with self._lock:
            try:
                obj = self._objects[key]
            except KeyError:
                obj = None
            if obj is None or obj.deleted:
                return None  # kmock answers 404
            current = obj.raw
            options = request.data if isinstance(request.data, dict) else {}
            wanted_uid = (options.get("preconditions") or {}).get("uid")
            if wanted_uid and wanted_uid != current["metadata"].get("uid"):
                message = (
                    f"Precondition failed: UID in precondition: {wanted_uid}, "
                    f"UID in object meta: {current['metadata'].get('uid')}"
                )
                return aiohttp.web.json_response(status_body(409, "Conflict", message), status=409)
            grace = options.get("gracePeriodSeconds")
            if grace is None:
                grace = (current.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
            bound = bool((current.get("spec") or {}).get("nodeName"))
            # as the API server: a pod whose containers all ended is deleted at once, whatever the grace
            ended = (current.get("status") or {}).get("phase") in ("Failed", "Succeeded")
            deleting = bool(current["metadata"].get("deletionTimestamp"))
            version = self._next_version()
            if bound and grace > 0 and not deleting and not ended:
                obj.patch(
                    {
                        "metadata": {
                            "deletionTimestamp": now(),
                            "deletionGracePeriodSeconds": grace,
                            "resourceVersion": version,
                        }
                    }
                )
                await self._buses[request.resource].put({"type": "MODIFIED", "object": obj.raw})
                return aiohttp.web.json_response(obj.raw, status=200)
            obj.patch({"metadata": {"resourceVersion": version}})
            if deleting or (current["metadata"].get("finalizers") or []) == []:
                raw = obj.raw
                obj.delete()
                self._collect_owned(raw)
                await self._buses[request.resource].put({"type": "DELETED", "object": raw})
                return aiohttp.web.json_response(raw, status=200)
        return None

    async def _serve_list(self, request: Any) -> Any:
        answer = await super()._serve_list(request)
        if request.resource is not None and request.resource.plural == "pods":
            answer["metadata"]["resourceVersion"] = str(self.version)
            answer["kind"] = "PodList"
            answer["apiVersion"] = "v1"
        return answer

    async def _serve_watch(self, request: Any) -> AsyncIterator[Any]:
        if request.resource is None or request.resource.plural != "pods":
            async for item in super()._serve_watch(request):
                yield item
            return
        yield b""
        since = _int(request.params.get("resourceVersion"))
        if since is not None and since < self.gone_below:
            yield {
                "type": "ERROR",
                "object": status_body(410, "Expired", f"too old resource version: {since}"),
            }
            return
        self._watchers.add(request)
        bus = self._buses[request.resource]
        marker = None
        try:
            async with self._lock:
                marker = await bus.mark()  # nothing is put while the lock is held
                replay = []
                for (resource, ns, _name), obj in self._objects.items():
                    if resource != request.resource or (request.namespace and ns != request.namespace):
                        continue
                    last = obj.last.raw
                    version = _int((last.get("metadata") or {}).get("resourceVersion")) or 0
                    if since is not None and version <= since:
                        continue
                    if obj.deleted:
                        if since is not None:
                            replay.append({"type": "DELETED", "object": last})
                    else:
                        replay.append({"type": "ADDED" if since is None else "MODIFIED", "object": last})
            for event in replay:
                yield event
            async for event in bus.stream(since=marker):
                namespace = ((event.get("object") or {}).get("metadata") or {}).get("namespace")
                if not request.namespace or namespace == request.namespace:
                    yield event
        finally:
            self._watchers.discard(request)
            if marker is not None:
                with contextlib.suppress(Exception):
                    await bus.unmark(marker)


def run_runtime(pod: dict[str, Any]) -> str:
    return str(((pod.get("metadata") or {}).get("labels") or {}).get("kruntimes.io/runtime", ""))


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def _own_ports(pod: dict[str, Any], held: list[socket.socket]) -> None:
    """Move the host container's named ports to ports held for it, and their mentions with them."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        moved: dict[int, int] = {}
        for port in container.get("ports") or []:
            old = port.get("containerPort")
            if isinstance(old, int):
                moved[old] = port["containerPort"] = held_port(held)
        for env in container.get("env") or []:
            if env.get("name", "").endswith("_PORT") and _int(env.get("value")) in moved:
                env["value"] = str(moved[int(env["value"])])
        probe = (container.get("readinessProbe") or {}).get("grpc")
        if probe and probe.get("port") in moved:
            probe["port"] = moved[probe["port"]]


# --- the test kubelet ---------------------------------------------------------------------------------

FAULTS = ("image-pull", "unschedulable", "crash", "crashloop", "evict", "init-error")


@dataclass
class _PodRun:
    name: str
    namespace: str
    uid: str
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    task: asyncio.Task[None] | None = None
    stopping: bool = False  # its status is no longer reported (deleted or evicted)
    finalizing: bool = False  # being deleted: stopped, then removed from the API
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    argv: list[str] = field(default_factory=list)  # the container's process, as the pod says
    pid_file: Path | None = None  # contained: where the container's parent writes its pid
    secrets: dict[str, dict[str, Any]] = field(default_factory=dict)  # volume → the data projected
    network: podnet.PodNetwork | None = None  # contained: its sandbox (podnet.py)
    ip: str = POD_IP


def can_contain() -> bool:
    """Whether this node runs containers (container.py): root, namespaces and overlayfs; tried
    once per process."""
    return os.geteuid() == 0 and _contained_true()


@functools.cache
def _contained_true() -> bool:
    with tempfile.TemporaryDirectory() as directory:
        scratch = Path(directory, "scratch")
        scratch.mkdir()
        security = {"readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
        spec = {"argv": ["true"], "env": {"PATH": "/usr/bin:/bin"}, "scratch": str(scratch), "mounts": []}
        Path(directory, "spec.json").write_text(json.dumps({**spec, "securityContext": security}))
        done = subprocess.run(
            [sys.executable, "-I", "-S", str(CONTAINER_RUNTIME), str(Path(directory, "spec.json"))],
            capture_output=True,
            timeout=30,
            check=False,
        )
        return done.returncode == 0


def security_context(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, Any] | None:
    """The container's security context over the pod's user settings; None when neither asks."""
    given = (pod.get("spec") or {}).get("securityContext")
    own = container.get("securityContext")
    if given is None and own is None:
        return None
    keys = ("runAsUser", "runAsGroup", "runAsNonRoot", "supplementalGroups")
    return {**{k: v for k, v in (given or {}).items() if k in keys}, **(own or {})}


@dataclass
class ContainerProcess:
    """A container's process as a test signals it: the pod's own process (PID 1 of the pod, seen
    from the node), not the container's parent."""

    parent: subprocess.Popen[bytes]
    args: list[str]
    pid_file: Path | None

    @property
    def pid(self) -> int:
        if self.pid_file is None:
            return self.parent.pid
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=PID_FILE_WAIT_S)
        while not self.pid_file.exists():
            if self.parent.poll() is not None:
                raise ProcessLookupError(f"no pid in {self.pid_file}: the container ended")
            if datetime.datetime.now() > deadline:  # a signal silently lost would fail a test far from here
                raise TimeoutError(f"no pid in {self.pid_file} within {PID_FILE_WAIT_S} s")
            time.sleep(0.01)
        return int(self.pid_file.read_text())

    def send_signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # the container has ended already
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def poll(self) -> int | None:
        return self.parent.poll()


class TestKubelet:
    """One node of the test cluster (see the module docstring). ``faults`` maps a runtime to the
    fault its pods get; ``evict(name)`` evicts a running pod."""

    __test__ = False

    def __init__(self, cluster: Cluster, *, url: str, root: Path, contain: bool | None = None) -> None:
        self.cluster = cluster
        self.url = url.rstrip("/")
        self.root = root
        # containers as a node runs them (container.py); None: wherever this machine can
        self.contains = can_contain() if contain is None else contain
        self.faults: dict[str, str] = {}
        self.hold: set[str] = set()  # runtimes whose pods wait in ContainerCreating until release()
        self._released = asyncio.Event()
        self.started: list[str] = []  # names of the pods whose process it started, in order
        self.initialized: list[tuple[str, str, int]] = []  # (pod, init container, exit code)
        self._runs: dict[str, _PodRun] = {}
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping: set[asyncio.Task[None]] = set()
        self._node_table = podnet.NodeTable()

    async def __aenter__(self) -> TestKubelet:
        self._session = aiohttp.ClientSession()
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for stopping in self._stopping:
            stopping.cancel()
        await asyncio.gather(*self._stopping, return_exceptions=True)
        for run in list(self._runs.values()):
            if run.task is not None:
                run.task.cancel()
            _kill(run.process)
        await asyncio.gather(*(r.task for r in self._runs.values() if r.task), return_exceptions=True)
        for run in self._runs.values():
            if run.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    run.process.wait(timeout=10)
        for run in self._runs.values():
            if run.network is not None:
                await run.network.stop()
        await self._node_table.remove()
        if self._session is not None:
            await self._session.close()

    def release(self) -> None:
        """Let pods of runtimes no longer in ``hold`` start."""
        self._released.set()
        self._released = asyncio.Event()

    def process(self, name: str) -> ContainerProcess | None:
        """The process of pod `name`'s container (signal it as a node's process)."""
        run = next((r for r in self._runs.values() if r.name == name), None)
        if run is None or run.process is None:
            return None
        return ContainerProcess(run.process, run.argv, run.pid_file)

    def running(self) -> list[str]:
        return [r.name for r in self._runs.values() if r.process is not None and r.process.poll() is None]

    # -- the API ---------------------------------------------------------------------------------------

    def _path(self, namespace: str, name: str, sub: str = "") -> str:
        return f"{self.url}/api/v1/namespaces/{namespace}/pods/{name}{sub}"

    async def _patch_status(self, run: _PodRun, status: dict[str, Any]) -> None:
        assert self._session is not None
        if "podIP" in status:
            status = {**status, "podIP": run.ip, "podIPs": [{"ip": run.ip}]}
        headers = {"Content-Type": "application/merge-patch+json"}
        async with self._session.patch(
            self._path(run.namespace, run.name, "/status"),
            data=json.dumps({"status": status}),
            headers=headers,
        ) as answer:
            await answer.read()

    async def _bind(self, run: _PodRun) -> None:
        assert self._session is not None
        headers = {"Content-Type": "application/merge-patch+json"}
        body = {"spec": {"nodeName": NODE}}
        async with self._session.patch(
            self._path(run.namespace, run.name), data=json.dumps(body), headers=headers
        ) as a:
            await a.read()

    async def _final_delete(self, run: _PodRun) -> None:
        assert self._session is not None
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": run.uid}}
        async with self._session.delete(self._path(run.namespace, run.name), json=body) as answer:
            await answer.read()

    async def _watch(self) -> None:
        assert self._session is not None
        while True:
            try:
                async with self._session.get(f"{self.url}/api/v1/pods", params={"watch": "true"}) as stream:
                    async for line in stream.content:
                        if line.strip():
                            event = json.loads(line)
                            self._on(event.get("type"), event.get("object") or {})
            except (aiohttp.ClientError, ValueError):
                await asyncio.sleep(0.05)

    def _on(self, kind: str | None, pod: dict[str, Any]) -> None:
        metadata = pod.get("metadata") or {}
        uid = metadata.get("uid")
        if not uid:
            return
        run = self._runs.get(uid)
        if kind == "DELETED":
            if run is not None:
                run.stopping = True
                _kill(run.process)
            return
        if run is None:
            if metadata.get("deletionTimestamp"):
                return
            run = self._runs[uid] = _PodRun(
                name=metadata["name"],
                namespace=metadata["namespace"],
                uid=uid,
                directory=self.root / f"{metadata['name']}-{uid[:8]}",
            )
            run.task = asyncio.create_task(self._run(run, pod))
        elif metadata.get("deletionTimestamp") and not run.finalizing:
            run.stopping = run.finalizing = True
            grace = int(metadata.get("deletionGracePeriodSeconds") or 0)
            self._stopping.add(asyncio.create_task(self._terminate(run, grace)))

    # -- running a pod ---------------------------------------------------------------------------------

    async def _run(self, run: _PodRun, pod: dict[str, Any]) -> None:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        fault = self.faults.get(labels.get("kruntimes.io/runtime", ""))
        container = pod["spec"]["containers"][0]
        scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}
        if fault == "unschedulable":
            message = "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available."
            await self._patch_status(
                run,
                {
                    "phase": "Pending",
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": message,
                        }
                    ],
                },
            )
            return
        await self._bind(run)
        if fault == "image-pull":
            for reason in ("ErrImagePull", "ImagePullBackOff"):
                waiting = {"reason": reason, "message": f'Back-off pulling image "{container["image"]}"'}
                await self._patch_status(run, self._status(container, "Pending", scheduled, waiting=waiting))
                await asyncio.sleep(0.05)
            return
        if fault == "crashloop":
            last = {
                "terminated": {
                    "exitCode": 1,
                    "reason": "Error",
                    "message": "krt: bad flag",
                    "finishedAt": now(),
                }
            }
            waiting = {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting failed container"}
            await self._patch_status(
                run, self._status(container, "Running", scheduled, waiting=waiting, last=last, restarts=1)
            )
            return
        runtime = labels.get("kruntimes.io/runtime", "")
        if runtime in self.hold:
            await self._patch_status(run, self._status(container, "Pending", scheduled))
            while runtime in self.hold:
                await self._released.wait()
        run.directory.mkdir(parents=True, exist_ok=True)
        if self.contains:
            users = pod["spec"].get("hostUsers") is False
            try:
                run.network = await podnet.start(
                    podnet.gateway_ports(container), self._node_table, users=users
                )
            except podnet.PodNetworkError as e:  # as a kubelet: the pod stays ContainerCreating
                waiting = {"reason": "ContainerCreating", "message": f"FailedCreatePodSandBox: {e}"}
                await self._patch_status(run, self._status(container, "Pending", scheduled, waiting=waiting))
                return
            run.ip = run.network.pod_ip
        try:
            await self._start(run, pod, container, scheduled, fault)
        finally:
            if run.network is not None:
                await run.network.stop()

    async def _start(
        self,
        run: _PodRun,
        pod: dict[str, Any],
        container: dict[str, Any],
        scheduled: dict[str, Any],
        fault: str | None,
    ) -> None:
        """The pod's containers, from its volumes to its end."""
        if not await self._mount_secrets(pod, run):  # as a kubelet: ContainerCreating until they exist
            return
        for init in pod["spec"].get("initContainers") or []:  # in order, each to its end
            if not await self._run_init(pod, init, container, scheduled, run):
                return
        argv, env = self._command(pod, container, run)
        run.argv = argv
        if self.contains:
            run.pid_file = run.directory / f"{container['name']}.pid"
        launch = self._launcher(pod, container, run, argv, env)
        with open(run.directory / "host.log", "ab") as log:
            run.process = subprocess.Popen(
                launch,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started.append(run.name)
        await self._patch_status(run, self._status(container, "Running", scheduled, running=True))
        if fault == "crash":
            _kill(run.process)
        if fault == "evict":  # before it is Ready: the node ran out of memory while it started
            await self.evict(run.name)
            return
        probe_port = ((container.get("readinessProbe") or {}).get("grpc") or {}).get("port")
        # one channel for the pod's probes (it reconnects as needed): the probes cost the node little
        backoff = [(f"grpc.{k}_reconnect_backoff_ms", 20) for k in ("initial", "min")]
        options = [*backoff, ("grpc.max_reconnect_backoff_ms", 100)]
        channel = grpc.aio.insecure_channel(f"{run.ip}:{probe_port}", options=options) if probe_port else None
        try:
            await self._probe(run, pod, container, scheduled, channel)
        finally:
            if channel is not None:
                await channel.close()

    async def _run_init(
        self,
        pod: dict[str, Any],
        init: dict[str, Any],
        container: dict[str, Any],
        scheduled: dict[str, Any],
        run: _PodRun,
    ) -> bool:
        """Run one init container's process to its end (bounded); a failure fails the pod."""
        argv, env = self._command(pod, init, run)
        if self.faults.get(run_runtime(pod)) == "init-error":  # the install finds nothing to copy
            argv += ["--bundle", "/nonexistent/no-bundle"]
        launch = self._launcher(pod, init, run, argv, env)
        with open(run.directory / f"{init['name']}.log", "ab") as log:
            process = await asyncio.create_subprocess_exec(
                *launch, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
            try:
                code = await asyncio.wait_for(process.wait(), INIT_TIMEOUT_S)
            except TimeoutError:
                process.kill()
                code = await process.wait()
        self.initialized.append((run.name, init["name"], code))
        if code == 0:
            return True
        terminated = {
            "exitCode": 128 - code if code < 0 else code,
            "reason": "Error",
            "message": f"init container {init['name']} failed",
            "finishedAt": now(),
        }
        await self._patch_status(run, self._status(container, "Failed", scheduled, terminated=terminated))
        return False

    async def _mount_secrets(self, pod: dict[str, Any], run: _PodRun) -> bool:
        """Write every secret and configMap volume's keys into the pod's volume directory, waiting
        for each object to exist (a kubelet retries the mount); False if the pod is deleted
        meanwhile."""
        for volume in pod["spec"].get("volumes") or []:
            projected = _projected(volume)
            if projected is None:
                continue
            plural, source = projected
            while (found := self.cluster.secret(run.namespace, source, plural=plural)) is None:
                if run.stopping:
                    return False
                await asyncio.sleep(0.02)
            self._project(run, volume, found)
        return True

    def _project(self, run: _PodRun, volume: dict[str, Any], secret: dict[str, Any]) -> None:
        """Write a Secret (or ConfigMap) into its volume as a kubelet's atomic writer does: the
        keys' files (or the `items`' at their paths) in a new timestamped directory, `..data`
        swapped to it in one rename, each a link through `..data`; then the old directory and
        the links to files no longer there are removed."""
        source = volume.get("secret") or volume["configMap"]
        values = {k: base64.b64decode(v) for k, v in (secret.get("binaryData") or {}).items()}
        for key, value in (secret.get("data") or {}).items():
            values[key] = base64.b64decode(value) if "secret" in volume else str(value).encode()
        items = source.get("items") or [{"key": key, "path": key} for key in values]
        files = {
            item["path"]: (values[item["key"]], item.get("mode")) for item in items if item["key"] in values
        }
        data = dict(secret.get("data") or {}) | dict(secret.get("binaryData") or {})
        directory = run.directory / "volumes" / volume["name"]
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o755)
        stamp = datetime.datetime.now(tz=datetime.UTC).strftime("..%Y_%m_%d_%H_%M_%S.%f")
        fresh = Path(tempfile.mkdtemp(prefix=stamp, dir=directory))
        fresh.chmod(0o755)
        for name, (value, mode) in files.items():
            path = fresh / name
            path.write_bytes(value)
            path.chmod(mode if mode is not None else source.get("defaultMode", 0o644))
        link = directory / "..data"
        old = os.readlink(link) if link.is_symlink() else None
        swap = directory / "..data_tmp"
        swap.unlink(missing_ok=True)
        swap.symlink_to(fresh.name)
        os.rename(swap, link)
        for name in files:
            if not (directory / name).is_symlink():
                (directory / name).symlink_to(f"..data/{name}")
        for entry in directory.iterdir():
            if entry.is_symlink() and not entry.name.startswith("..") and entry.name not in files:
                entry.unlink()
        if old is not None:
            shutil.rmtree(directory / old, ignore_errors=True)
        run.secrets[volume["name"]] = data

    def _sync_secrets(self, pod: dict[str, Any], run: _PodRun) -> None:
        """Follow the objects of a running pod's secret and configMap volumes (a kubelet's
        periodic sync)."""
        for volume in pod["spec"].get("volumes") or []:
            projected = _projected(volume)
            if projected is not None:
                found = self.cluster.secret(run.namespace, projected[1], plural=projected[0])
                data = dict((found or {}).get("data") or {}) | dict((found or {}).get("binaryData") or {})
                if found is not None and data != run.secrets.get(volume["name"]):
                    self._project(run, volume, found)

    async def _probe(
        self,
        run: _PodRun,
        pod: dict[str, Any],
        container: dict[str, Any],
        scheduled: dict[str, Any],
        channel: grpc.aio.Channel | None,
    ) -> None:
        """Probe readiness while the process runs, report changes, then report how it ended."""
        assert run.process is not None
        ready = False
        loop = asyncio.get_running_loop()
        synced = loop.time()
        while run.process.poll() is None:
            if loop.time() - synced >= SECRET_SYNC_S:
                self._sync_secrets(pod, run)
                synced = loop.time()
            serving = await _serving(channel)
            if serving != ready and not run.stopping:
                ready = serving
                await self._patch_status(
                    run, self._status(container, "Running", scheduled, running=True, ready=ready)
                )
            await asyncio.sleep(0.02 if not ready else 0.2)
        code = run.process.returncode
        terminated = {
            "exitCode": 128 - code if code < 0 else code,
            "reason": "Completed" if code == 0 else "Error",
            "finishedAt": now(),
        }
        if code < 0:
            terminated["signal"] = -code
        run.ended.set()
        if not run.stopping:
            phase = "Succeeded" if code == 0 else "Failed"
            await self._patch_status(run, self._status(container, phase, scheduled, terminated=terminated))

    async def evict(self, name: str) -> None:
        """Evict a running pod as a kubelet under memory pressure does: kill it, phase Failed."""
        run = next(r for r in self._runs.values() if r.name == name)
        run.stopping = True
        _kill(run.process)
        status = {
            "phase": "Failed",
            "reason": "Evicted",
            "message": "The node was low on resource: memory. Threshold quantity: 100Mi, available: 12Mi.",
            "conditions": [
                {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"},
                {"type": "Ready", "status": "False"},
            ],
        }
        await self._patch_status(run, status)

    async def _terminate(self, run: _PodRun, grace_s: int) -> None:
        process = run.process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + grace_s
            while process.poll() is None and loop.time() < deadline:
                await asyncio.sleep(0.02)
            _kill(process)
            while process.poll() is None:
                await asyncio.sleep(0.02)
        await self._final_delete(run)

    def _status(
        self,
        container: dict[str, Any],
        phase: str,
        scheduled: dict[str, Any],
        *,
        running: bool = False,
        ready: bool = False,
        waiting: dict[str, Any] | None = None,
        terminated: dict[str, Any] | None = None,
        last: dict[str, Any] | None = None,
        restarts: int = 0,
    ) -> dict[str, Any]:
        state: dict[str, Any]
        if terminated is not None:
            state = {"terminated": terminated}
        elif running:
            state = {"running": {"startedAt": now()}}
        else:
            state = {"waiting": waiting or {"reason": "ContainerCreating"}}
        flag = "True" if ready else "False"
        status: dict[str, Any] = {
            "phase": phase,
            "hostIP": POD_IP,
            "podIP": POD_IP,
            "podIPs": [{"ip": POD_IP}],
            "startTime": now(),
            "conditions": [
                scheduled,
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": flag},
                {"type": "Ready", "status": flag},
            ],
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container["image"],
                    "imageID": f"{container['image']}@sha256:{'0' * 64}",
                    "ready": ready,
                    "started": running,
                    "restartCount": restarts,
                    "state": state,
                    "lastState": last or {},
                }
            ],
        }
        return status

    def _command(
        self, pod: dict[str, Any], container: dict[str, Any], run: _PodRun
    ) -> tuple[list[str], dict[str, str]]:
        """The process of the container: its env (downward API filled in), $(VAR) expanded, the
        `krt` console script of this venv, mount paths mapped to the pod's directories."""
        fields = {
            "metadata.name": pod["metadata"]["name"],
            "metadata.namespace": pod["metadata"]["namespace"],
            "metadata.uid": pod["metadata"]["uid"],
            "status.podIP": run.ip,
        }
        for kind in ("labels", "annotations"):
            for key, value in (pod["metadata"].get(kind) or {}).items():
                fields[f"metadata.{kind}['{key}']"] = str(value)
        env: dict[str, str] = {}
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = _expand(str(item["value"]), env)
                continue
            path = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            if path in fields:
                env[item["name"]] = fields[path]
            elif isinstance(path, str) and path.startswith(("metadata.labels[", "metadata.annotations[")):
                env[item["name"]] = ""  # as a kubelet: a label or annotation the pod lacks is empty
        mounts = self._volumes(pod, container, run)
        argv = [_expand(a, env) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
        if not self.contains:  # the volumes are not at their mount paths: name the pod's directories
            argv = [_mapped(a, mounts) for a in argv]
        if argv and argv[0] == "krt":
            argv = [sys.executable, "-m", "kruntimes.workers.krt", *argv[1:]]
        process_env = {**{k: v for k, v in os.environ.items() if not k.startswith("KRT_")}, **env}
        return argv, process_env

    def _volumes(self, pod: dict[str, Any], container: dict[str, Any], run: _PodRun) -> dict[str, Path]:
        """Each mount path of the container and the pod's directory of its volume (an emptyDir
        world-writable, as a kubelet makes it)."""
        empty = {v["name"] for v in pod["spec"].get("volumes") or [] if "emptyDir" in v}
        mounts = {}
        for mount in container.get("volumeMounts") or []:
            directory = mounts[mount["mountPath"]] = run.directory / "volumes" / mount["name"]
            if not directory.exists():
                directory.mkdir(parents=True)
                if mount["name"] in empty:
                    directory.chmod(0o777)
        return mounts

    def _launcher(
        self,
        pod: dict[str, Any],
        container: dict[str, Any],
        run: _PodRun,
        argv: list[str],
        env: dict[str, str],
    ) -> list[str]:
        """What the node starts for the container: its process itself, or, contained, the
        container runtime (container.py) with the container's spec."""
        if not self.contains:
            return argv
        read_only = {m["mountPath"] for m in container.get("volumeMounts") or [] if m.get("readOnly")}
        scratch = Path(tempfile.mkdtemp(prefix=f"{container['name']}-root-", dir=run.directory))
        spec = {
            "argv": argv,
            "env": env,
            "cwd": os.getcwd(),
            "scratch": str(scratch),
            "reachable": sorted({sys.base_prefix, sys.prefix, os.getcwd()}),
            "mounts": [
                {"source": str(source), "target": target, "readOnly": target in read_only}
                for target, source in self._volumes(pod, container, run).items()
            ],
            "hostname": run.name,
            "pidFile": str(run.directory / f"{container['name']}.pid"),
            "securityContext": security_context(pod, container),
            "sandbox": {"pid": run.network.pid, "users": run.network.users} if run.network else None,
        }
        path = run.directory / f"{container['name']}.json"
        path.write_text(json.dumps(spec))
        return [sys.executable, "-I", "-S", str(CONTAINER_RUNTIME), str(path)]


def _projected(volume: dict[str, Any]) -> tuple[str, str] | None:
    """The object a secret or configMap volume shows: (its plural, its name); None for others."""
    if volume.get("secret"):
        return "secrets", str(volume["secret"]["secretName"])
    if volume.get("configMap"):
        return "configmaps", str(volume["configMap"]["name"])
    return None


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known variables replaced, $$ is $, unknown ones kept."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _VAR.sub(one, text)


def _mapped(arg: str, mounts: dict[str, Path]) -> str:
    for mount, directory in mounts.items():
        if arg == mount or arg.startswith(mount.rstrip("/") + "/"):
            return str(directory) + arg[len(mount.rstrip("/")) :]
    return arg


async def _serving(channel: grpc.aio.Channel | None) -> bool:
    """The gRPC readiness probe: the health service answers SERVING."""
    if channel is None:
        return True
    try:
        answer = await channel.unary_unary(
            _HEALTH,
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
    except grpc.aio.AioRpcError:
        return False
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def _kill(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()


@contextlib.asynccontextmanager
async def test_cluster(root: Path) -> AsyncIterator[tuple[Cluster, Server, TestKubelet]]:
    """A Cluster served on 127.0.0.1 (a port picked now) with a TestKubelet watching it."""
    cluster = Cluster()
    try:
        async with (
            cluster,
            Server(cluster) as server,
            TestKubelet(cluster, url=str(server.url), root=root) as kubelet,
        ):
            cluster.pod_networks = kubelet.contains
            yield cluster, server, kubelet
    finally:
        cluster.release_ports()


test_cluster.__test__ = False  # type: ignore[attr-defined]
