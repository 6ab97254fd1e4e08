"""What a function can see and do in a host pod of the Helm chart, under each supported setting:
the isolation suite's attempts (tests/isolation/probes.py) run by functions of a real `krt host`
in the chart's rendered pod on the test node (tests/kubernetes/cluster.py: the pod's security
context, read-only root, its own network namespace and address, and for `hostUsers: false` a user
namespace of its own), each outcome the one the README's Kubernetes section and
docs/kubernetes.md ("What a host pod writes, and what its functions can see") claim for that
setting. One pod per setting, shared by the module's tests; no Temporal, worker or gateway: the
test registers functions with the control plane's signed assignments and invokes them as a
gateway."""

from __future__ import annotations

import base64
import json
import socket
import textwrap
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kruntimes.activities.hosts import kubernetes_pods as kpods
from kruntimes.activities.hosts.kubernetes import KubernetesAccess, KubernetesProvider, connect, runtimes_of
from kruntimes.config.runtimes import parse_config
from kruntimes.contracts.providers import CreatedHost, HostDefaults, HostSpec, host_sandbox
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.runtime.sandbox.identity import UidRange, present
from tests.helm.conftest import render
from tests.helm.host_pods import chart_runtime
from tests.isolation import probes
from tests.isolation.conftest import ATTACKER
from tests.kubernetes import podnet
from tests.kubernetes.cluster import Cluster, TestKubelet, can_contain, test_cluster
from tests.kubernetes.conftest import IMAGE, NAMESPACE
from tests.support.isolation import require_or_skip
from tests.support.pki import TestPKI
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(120)

# The chart's settings a host pod runs under: its default (a user namespace of its own, the host
# making a PID and a mount namespace per function) and hosts.userNamespaces false (the node's
# users: no SYS_ADMIN, so no namespaces for functions).
SETTINGS = {"userNamespaces-true": None, "userNamespaces-false": {"hosts": {"userNamespaces": False}}}
# What the host says is in force (docs/kubernetes.md quotes these words per setting).
IN_FORCE = {
    "userNamespaces-true": [
        "own uid per function",
        "PID namespace",
        "private read-only mounts and IPC",
        "network outbound",
        "no cgroup (rlimits only)",
        "syscall filter",
        "Landlock",
    ],
    "userNamespaces-false": [
        "own uid per function",
        "no PID namespace",
        "shared mounts",
        "network outbound",
        "no cgroup (rlimits only)",
        "syscall filter",
        "Landlock",
    ],
}
REFUSED = ("PermissionError", "FileNotFoundError")
SECRET_FILE = f"{kpods.STATE_DIR}/secrets/default/db/PASSWORD"
SECRET = "hunter2-pod-isolation"
CAP_NET_ADMIN, CAP_SYS_ADMIN = 1 << 12, 1 << 21
# A function whose processes escape its session (setsid and a double fork): they must end with it.
ESCAPE = """
import os, time
def handle(p):
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, b"x")
            time.sleep(300)
        os._exit(0)
    os.close(w)
    os.wait()
    os.read(r, 1)
    return {"uid": os.getuid(), "uid_map": open("/proc/self/uid_map").read().split()}
"""


@dataclass
class Node:
    cluster: Cluster
    kubelet: TestKubelet
    api_url: str
    pki: TestPKI
    # a service of the node's loopback the host dials (as it dials a gateway's heartbeat port)
    service: socket.socket


@dataclass
class PodHost:
    setting: str
    created: CreatedHost
    pod: dict[str, Any]
    control: pb_grpc.FunctionRuntimeStub
    gateway: pb_grpc.FunctionRuntimeStub
    pki: TestPKI

    @property
    def own_namespaces(self) -> bool:
        return self.setting == "userNamespaces-true"

    async def register(self, source: str = ATTACKER) -> PodFunction:
        run = pb.RunRef(
            run_uid=str(uuid.uuid4()),
            attempt=1,
            namespace="default",
            name="fn",
            runtime=self.created.runtime,
        )
        signed = self.pki.sign(
            run_uid=run.run_uid,
            attempt=1,
            host_id=self.created.hostId,
            host_uid=self.created.hostUid,
            runtime=self.created.runtime,
        )
        config = pb.FunctionConfig(
            adapter="python",
            handler="main:handle",
            inline=pb.InlineSource(files=[pb.InlineFile(name="main.py", content=source.encode())]),
        )
        request = pb.RegisterFunctionRequest(run=run, config=config, assignment=signed)
        answer = await self.control.RegisterFunction(request, timeout=60)
        return PodFunction(self, answer.registration_id)

    async def unregister(self, function: PodFunction) -> None:
        request = pb.UnregisterFunctionRequest(registration_id=function.registration_id, grace_ms=100)
        await self.control.UnregisterFunction(request, timeout=30)

    def node_uid(self, uid: int, uid_map: list[str]) -> int:
        """A uid of the pod as the node knows it (through the pod's user namespace, if any)."""
        inside, base, count = (int(x) for x in uid_map)
        assert inside <= uid < inside + count
        return base + uid - inside

    async def answers(self) -> bool:
        info = await self.control.HostInfo(pb.HostInfoRequest(), timeout=10)
        return bool(info.host_uid == self.created.hostUid)


@dataclass
class PodFunction:
    host: PodHost
    registration_id: str

    async def invoke(self, payload: dict[str, Any]) -> pb.InvokeFunctionResponse:
        request = pb.InvokeFunctionRequest(
            registration_id=self.registration_id, payload=json.dumps(payload).encode(), timeout_ms=20_000
        )
        return await self.host.gateway.InvokeFunction(request, timeout=30)

    async def run(self, code: str) -> Any:
        """Run `code` inside the function; what it leaves in `result` comes back."""
        answer = await self.invoke({"code": textwrap.dedent(code)})
        assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED, (answer.error.type, answer.error.message)
        return json.loads(answer.outputs_json)["result"]


async def _post(node: Node, plural: str, body: dict[str, Any]) -> None:
    async with node.kubelet._session.post(
        f"{node.api_url}/api/v1/namespaces/{NAMESPACE}/{plural}", json=body
    ) as answer:
        assert answer.status in (200, 201), (answer.status, await answer.text())


@pytest.fixture(scope="module")
async def node(tmp_path_factory: pytest.TempPathFactory, pki: TestPKI) -> AsyncIterator[Node]:
    """The test node, with what an operator puts in the hosts' namespace: the chart's ConfigMap of
    role bindings and a Secret the pods mount in the host's secrets directory."""
    if not can_contain():
        require_or_skip("the test node enforces a pod's security context only as root, with overlayfs")
    async with test_cluster(tmp_path_factory.mktemp("pod-isolation")) as (cluster, server, kubelet):
        with socket.create_server(("127.0.0.1", 0)) as service:
            service.setblocking(False)
            node = Node(cluster, kubelet, str(server.url).rstrip("/"), pki, service)
            docs, _ = render({})
            [bindings] = [
                d
                for d in docs
                if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-role-bindings")
            ]
            bindings["metadata"]["namespace"] = NAMESPACE
            await _post(node, "configmaps", bindings)
            secret = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "db", "namespace": NAMESPACE},
                "data": {"PASSWORD": base64.b64encode(SECRET.encode()).decode()},
            }
            await _post(node, "secrets", secret)
            yield node


@pytest.fixture(scope="module", params=list(SETTINGS))
async def host(request: pytest.FixtureRequest, node: Node) -> AsyncIterator[PodHost]:
    """A host in the chart's pod rendered under this setting, made by the real provider."""
    setting: str = request.param
    name = "iso-ns" if setting == "userNamespaces-true" else "iso-off"
    runtime = chart_runtime(
        name,
        namespace=NAMESPACE,
        image=IMAGE,
        kubernetes={"startTimeoutSeconds": 40, "deleteGraceSeconds": 2},
        values=SETTINGS[setting],
    )
    template = runtime["kubernetes"]["podTemplate"]
    template["volumes"].append({"name": "db", "secret": {"secretName": "db", "defaultMode": 0o400}})
    template["volumeMounts"].append(
        {"name": "db", "mountPath": f"{kpods.STATE_DIR}/secrets/default/db", "readOnly": True}
    )
    config = parse_config({"runtimes": [runtime]})
    spec = HostSpec(
        runtime=name,
        hostId=f"{name}-0",
        adapter="python",
        provider="kubernetes",
        stateDir="/nonexistent",
        gateways=[f"127.0.0.1:{node.service.getsockname()[1]}"],
        heartbeatIntervalSeconds=1,
        sandbox=host_sandbox(config.runtimes[0], HostDefaults()),
    )
    api = await connect(KubernetesAccess(host=node.api_url))
    try:
        provider = KubernetesProvider(
            api, runtimes=runtimes_of(config), control_plane="pod-isolation", issuer=node.pki.issuer()
        )
        created = await provider.create(spec)  # a create that fails deletes its pod
        try:
            [pod] = [p for p in node.cluster.pods(NAMESPACE) if p["metadata"]["uid"] == created.hostUid]
            async with (
                node.pki.aio_channel(created.address, as_=node.pki.control_plane) as control,
                node.pki.aio_channel(created.address, as_=node.pki.gateway) as gateway,
            ):
                stubs = pb_grpc.FunctionRuntimeStub(control), pb_grpc.FunctionRuntimeStub(gateway)
                yield PodHost(setting, created, pod, *stubs, node.pki)
        finally:
            await provider.delete(runtime=name, host_id=spec.hostId, host_uid=created.hostUid)
            await eventually(
                lambda: (
                    not [p for p in node.cluster.pods(NAMESPACE) if p["metadata"]["uid"] == created.hostUid]
                ),
                within=30,
                what="the pod deleted",
            )
    finally:
        await api.close()


@dataclass
class Seen:
    """A registered function, and what it says of itself (probes.IDENTITY)."""

    function: PodFunction
    identity: dict[str, Any]


@pytest.fixture(scope="module")
async def victim(host: PodHost) -> AsyncIterator[Seen]:
    """A function that keeps a file of its own in its workspace, and stays up (its warm process)."""
    function = await host.register()
    await function.run("open('own-file', 'w').write('the victim\\'s')\nresult = 1")
    yield Seen(function, await function.run(probes.IDENTITY))
    await host.unregister(function)


@pytest.fixture(scope="module")
async def attacker(host: PodHost) -> AsyncIterator[Seen]:
    function = await host.register()
    yield Seen(function, await function.run(probes.IDENTITY))
    await host.unregister(function)


async def test_the_host_says_what_it_gives_functions_and_is_no_root_of_the_node_in_a_user_namespace(
    host: PodHost, node: Node
) -> None:
    said = (await host.control.HostInfo(pb.HostInfoRequest(), timeout=10)).isolation.summary
    for words in IN_FORCE[host.setting]:
        assert words in said, (host.setting, said)
    if host.own_namespaces:
        assert "no PID namespace" not in said, said
    process = node.kubelet.process(host.pod["metadata"]["name"])
    assert process is not None
    pid = process.pid
    if (
        host.own_namespaces
    ):  # the test node's stand-in that entered the pod's namespaces; the host is its child
        [pid] = map(int, Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
    assert b"kruntimes.workers.krt\0host\0" in Path(f"/proc/{pid}/cmdline").read_bytes()
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    node_uid = int(status["Uid"].split()[0])
    capabilities = int(status["CapEff"].strip(), 16)
    if host.own_namespaces:  # the pod's root: an unprivileged node uid; SYS_ADMIN only over its namespaces
        assert node_uid >= podnet.USERNS_BASE and capabilities & CAP_SYS_ADMIN, status["Uid"]
        assert host.pod["spec"]["hostUsers"] is False
    else:  # the node's root, with NET_ADMIN (packet rules) and no SYS_ADMIN
        assert node_uid == 0 and capabilities & CAP_NET_ADMIN and not capabilities & CAP_SYS_ADMIN
        assert "hostUsers" not in host.pod["spec"]
    assert host.pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


async def test_a_function_runs_as_its_own_uid_without_capabilities(
    host: PodHost, attacker: Seen, victim: Seen
) -> None:
    seen = attacker.identity
    assert seen["uid"] not in (0, victim.identity["uid"]), seen
    assert seen["gid"] == seen["uid"] and seen["groups"] == [], seen
    assert seen["caps"] == ["0000000000000000"] * 4 and seen["no_new_privs"] == "1", seen
    assert not seen["regained"]
    node_uids = {host.node_uid(s["uid"], s["uid_map"]) for s in (seen, victim.identity)}
    if host.own_namespaces:  # a uid of the pod's user namespace: an unprivileged node uid of its range
        assert seen["uid"] in UidRange.parse(kpods.USERNS_UID_RANGE)
        assert min(node_uids) >= podnet.USERNS_BASE
    else:  # a node uid of the range the provider gave the pod
        assert seen["uid_map"] == ["0", "0", "4294967295"]
        given = UidRange.parse(host.pod["metadata"]["annotations"][kpods.ANNOTATION_UID_RANGE])
        assert all(uid in given for uid in node_uids)
    # its workspace is its HOME, its TMPDIR and where it starts
    assert seen["env"]["HOME"] == seen["env"]["TMPDIR"] == seen["cwd"], seen


async def test_the_processes_a_function_sees_and_signals(host: PodHost, attacker: Seen, victim: Seen) -> None:
    seen: dict[str, str] = await attacker.function.run(probes.PROCESSES)
    own = str(attacker.identity["pid"])
    hosts = [pid for pid, line in seen.items() if "kruntimes.workers.krt" in line]
    if host.own_namespaces:  # a PID namespace: its own processes only
        assert own in seen and len(seen) <= 2 and not hosts, seen
        return
    # every process of the pod: the host's, the other function's; but it signals and traces none
    assert hosts and str(victim.identity["pid"]) in seen, seen
    others = sorted(int(pid) for pid in seen if pid != own)
    outcome = await attacker.function.run(probes.signal(others))
    assert all(kill != "sent" and trace != "attached" for kill, trace in outcome.values()), outcome
    assert (await victim.function.run(probes.IDENTITY))["pid"] == victim.identity["pid"], "still the same"
    assert await host.answers()


async def test_the_files_a_function_reads_and_writes(host: PodHost, attacker: Seen, victim: Seen) -> None:
    workspace = victim.identity["env"]["HOME"]
    secrets = [
        f"{kpods.CERT_MOUNT}/tls.key",  # the host's key
        kpods.ROLE_BINDINGS_FILE,
        SECRET_FILE,  # a Secret mounted for Runs: read by the host, handed only to a Run allowed it
        f"{workspace}/own-file",  # another function's files
    ]
    found = await attacker.function.run(probes.read(secrets))
    # in its mount namespace hidden or closed; in the pod's, there and closed (0400, 0700)
    refused = REFUSED if host.own_namespaces else ("PermissionError",)
    assert all(found[path] in refused for path in secrets), found
    assert await attacker.function.run(probes.listdir(workspace)) in refused
    own = attacker.identity["env"]["HOME"]
    image = ["/krt-planted", "/usr/krt-planted", "/var/tmp/krt-planted"]
    image += [f"{kpods.STATE_MOUNT}/krt-planted", f"{kpods.STATE_DIR}/krt-planted"]
    writable = [f"{own}/mine", f"/tmp/krt-{host.setting}"]
    if host.own_namespaces:
        writable.append(f"/dev/shm/krt-{host.setting}")
    written = await attacker.function.run(probes.write(image + writable))
    assert written["/krt-planted"] == written["/usr/krt-planted"] == "EROFS", written
    assert all(written[path] != "written" for path in image), written
    assert all(written[path] == "written" for path in writable), written
    # nor rename the host's state directory aside (its volume's root is an emptyDir's, 0777)
    moved = await attacker.function.run(probes.move([kpods.STATE_DIR, f"{kpods.STATE_DIR}/work"]))
    assert all(outcome in ("PermissionError", "OSError") for outcome in moved.values()), moved
    state = await attacker.function.run(probes.listdir(kpods.STATE_DIR))
    if host.own_namespaces:  # the state directory hidden
        assert state in (*REFUSED, []), state
    assert SECRET not in json.dumps([found, state])


async def test_tmp_and_dev_shm_are_the_functions_own_or_the_pods_shared_and_sticky(
    host: PodHost, attacker: Seen, victim: Seen
) -> None:
    places = [f"/tmp/krt-left-{host.setting}", f"/dev/shm/krt-left-{host.setting}"]
    assert set((await attacker.function.run(probes.write(places))).values()) == {"written"}
    found = await victim.function.run(probes.read(places))
    if host.own_namespaces:  # a private /tmp and /dev/shm
        assert all(value == "FileNotFoundError" for value in found.values()), found
        return
    # the pod's, shared: the other sees what it left, but cannot delete or replace it (sticky, 1777)
    assert all(value == "left by a function" for value in found.values()), found
    modes = await victim.function.run(
        "import os\nresult = [oct(os.stat(d).st_mode & 0o7777) for d in ('/tmp', '/dev/shm')]"
    )
    assert modes == [oct(0o1777)] * 2, modes
    removed = await victim.function.run(probes.remove(places))
    assert all(outcome == ["PermissionError", "PermissionError"] for outcome in removed.values()), removed
    assert await attacker.function.run(probes.read(places)) == dict.fromkeys(places, "left by a function")


async def test_no_port_of_the_pod_or_the_node_is_reachable(host: PodHost, node: Node, attacker: Seen) -> None:
    pod_ip = host.pod["status"]["podIP"]
    ports = [p["containerPort"] for p in host.pod["spec"]["containers"][0]["ports"]]
    service = node.service.getsockname()[1]
    # Each listens (the host's ports on the pod's address: this test's channels reach them; the
    # node's service: the host dials it through the node's DNAT, as a gateway's port), yet none
    # answers the function: the packet rules of `network: outbound` refuse its connections.
    await eventually(lambda: _accepted(node.service), within=30, what="the host dials the node's service")
    addresses = [(address, port) for address in ("127.0.0.1", pod_ip) for port in [*ports, service]]
    outcome = await attacker.function.run(probes.connect(addresses))
    assert all(value != "connected" for value in outcome.values()), outcome


def _accepted(service: socket.socket) -> bool:
    """Whether a connection waited on the service (each one accepted and closed)."""
    try:
        connection, _ = service.accept()
    except BlockingIOError:
        return False
    connection.close()
    return True


async def test_a_functions_processes_all_end_with_it(host: PodHost) -> None:
    function = await host.register(ESCAPE)
    answer = await function.invoke({})
    assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED, answer.error.message
    seen = json.loads(answer.outputs_json)
    uid = host.node_uid(seen["uid"], seen["uid_map"])
    assert len(present(uid)) >= 2, "its process and the one that escaped, on the node"
    await host.unregister(function)
    await eventually(lambda: present(uid) == [], within=10, what="nothing of it outlives its unregistration")


async def test_what_two_functions_of_a_pod_share(host: PodHost, attacker: Seen, victim: Seen) -> None:
    """Both share the pod's network namespace: an abstract Unix socket of one is closed to the
    other (Landlock's scope). System V IPC: private in an IPC namespace of its own; without
    one, the pod's."""
    name = f"krt-victim-{host.setting}"
    assert await victim.function.run(probes.abstract_listen(name)) == "connected", "its own"
    assert await attacker.function.run(probes.abstract_connect(name)) == "PermissionError"
    key = 0x6B7274 + (1 if host.own_namespaces else 2)
    made = await attacker.function.run(probes.shm(key, create=True))
    assert made[0] >= 0 and key in made[1], made
    found = await victim.function.run(probes.shm(key, create=False))
    if host.own_namespaces:
        assert found[0] == -1 and key not in found[1], found
    else:  # what one makes open to every uid (0666), the other attaches
        assert found[0] >= 0 and key in found[1], found
