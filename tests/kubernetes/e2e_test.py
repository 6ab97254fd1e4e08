"""End to end through the control plane with `provider: kubernetes` runtimes: the real dev
server, the worker, the HTTPS gateway, and the test cluster's kubelet running each host pod as a
real `krt host` process."""

from __future__ import annotations

import asyncio
import base64
import signal
from collections.abc import AsyncIterator

import pytest

from kruntimes.activities.hosts import kubernetes_pods as kpods
from kruntimes.activities.hosts.kubernetes import (
    KubernetesAccess,
    KubernetesProvider,
    OrphanCollector,
    connect,
    runtimes_of,
)
from kruntimes.api import Run
from kruntimes.api.phases import RunPhase
from kruntimes.config.runtimes import parse_config
from kruntimes.runtime.sandbox.identity import UidRange
from kruntimes.sdk.client import Client
from kruntimes.sdk.errors import NotReady
from tests.helm.conftest import render
from tests.helm.host_pods import chart_runtime
from tests.kubernetes.platform import (
    IMAGE,
    NAMESPACE,
    KubePlatform,
    kube_platform,
    kubernetes_runtime,
    manifest,
    stop_process,
)
from tests.support.isolation import require_or_skip
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(180)

# A runtime per failure, each failing its own way; "kpy" works.
FAULTS = {
    "k-image": ("image-pull", "ImagePullFailed"),
    "k-unsched": ("unschedulable", "Unschedulable"),
    "k-crash": ("crash", "HostCrashed"),
    "k-evict": ("evict", "HostLost"),
}
REFUSALS = {
    "k-quota": (
        403,
        "Forbidden",
        'pods "x" is forbidden: exceeded quota: hosts, limited: pods=0',
        "QuotaExceeded",
    ),
    "k-admit": (
        422,
        "Invalid",
        'admission webhook "policy.example" denied the request: no',
        "AdmissionDenied",
    ),
    "k-rbac": (
        403,
        "Forbidden",
        'pods is forbidden: User "system:serviceaccount:krt:w" cannot create resource "pods"',
        "Forbidden",
    ),
    "k-apidown": (
        503,
        "ServiceUnavailable",
        "the server is currently unable to handle the request",
        "ApiUnavailable",
    ),
}
# The chart's default host pod (a user namespace of its own, read-only root, only the
# capabilities its isolation needs, a writable /tmp, the chart's role bindings), and the chart's
# pod with hosts.userNamespaces false (the node's users), a Run a pod; with the Secret `db` where
# a Run of namespace default finds it (the host's secrets directory: docs/kubernetes.md).
CHART, CHART_HOST_USERS = (
    chart_runtime(
        name,
        namespace=NAMESPACE,
        image=IMAGE,
        kubernetes={"startTimeoutSeconds": 20, "deleteGraceSeconds": 5},
        values=values,
        runs=1,
        maxHosts=1,
    )
    for name, values in (("kchart", None), ("kchart-off", {"hosts": {"userNamespaces": False}}))
)
for chart in (CHART, CHART_HOST_USERS):
    chart["kubernetes"]["podTemplate"]["volumes"].append(
        {"name": "db", "secret": {"secretName": "db", "defaultMode": 0o400}}
    )
    chart["kubernetes"]["podTemplate"]["volumeMounts"].append(
        {"name": "db", "mountPath": f"{kpods.STATE_DIR}/secrets/default/db", "readOnly": True}
    )
# Who creates the Run that uses it, and the chart's bindings that let them.
CREATOR = "e2e-ci"
BINDINGS = {"bindings": [{"namespace": "default", "users": [CREATOR], "secrets": ["db"]}]}
RUNTIMES = [
    CHART,
    CHART_HOST_USERS,
    kubernetes_runtime("kpy", pool={"scaleInDelaySeconds": 1}),  # an idle pod goes at once
    kubernetes_runtime("krecover"),
    # Unschedulable is reported when the start timeout runs out: short, yet long enough for the
    # test kubelet to mark the pod unschedulable on a loaded machine.
    kubernetes_runtime("k-unsched", startTimeoutSeconds=4),
    *(kubernetes_runtime(name) for name in [*FAULTS, *REFUSALS] if name != "k-unsched"),
]


async def invoke(krt: Client, name: str, payload: dict):
    """Invoke once the gateway knows the Run is Ready (what it knows lags the Run by a moment)."""

    async def answered():
        try:
            return await krt.invoke(name, payload)
        except NotReady:
            return None

    return await eventually(answered, within=20, what=f"{name} answers")


async def collect_orphans(platform, *, control_plane: str, runtimes: list[dict]):
    """What the supervisor of hosts will do: sweep this control plane's pods, knowing its pools' hosts."""
    config = parse_config({"runtimes": runtimes})
    known = set()
    for rt in config.runtimes:
        state = await platform.temporal.get_workflow_handle(f"pool/{rt.name}").query("pool")
        known |= {h["hostUid"] for h in state["hosts"]}
    api = await connect(KubernetesAccess(host=platform.api_url))
    try:
        provider = KubernetesProvider(
            api, runtimes=runtimes_of(config), control_plane=control_plane, issuer=platform.pki.issuer()
        )
        return await OrphanCollector(provider, grace_s=0).sweep(known=known)
    finally:
        await api.close()


@pytest.fixture(scope="module")
async def platform(tmp_path_factory, pki) -> AsyncIterator[KubePlatform]:
    async with kube_platform(tmp_path_factory.mktemp("k8s-e2e"), pki, runtimes=RUNTIMES) as started:
        for runtime, (fault, _) in FAULTS.items():
            started.kubelet.faults[runtime] = fault
        for runtime, (status, reason, message, _) in REFUSALS.items():
            started.cluster.refuse(runtime=runtime, status=status, reason=reason, message=message)
        await create_host_objects(started)
        yield started


async def create_host_objects(platform: KubePlatform) -> None:
    """What an operator puts in the hosts' namespace: the Secret `db`, and the chart's ConfigMap
    of the hosts' role bindings, rendered with BINDINGS."""
    docs, _ = render({"hosts": {"roleBindings": BINDINGS}})
    [bindings] = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-role-bindings")
    ]
    bindings["metadata"]["namespace"] = NAMESPACE
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "db", "namespace": NAMESPACE},
        "data": {"PASSWORD": base64.b64encode(b"hunter2-e2e").decode()},
    }
    for plural, body in (("configmaps", bindings), ("secrets", secret)):
        async with platform.kubelet._session.post(
            f"{platform.api_url}/api/v1/namespaces/{NAMESPACE}/{plural}", json=body
        ) as answer:
            assert answer.status in (200, 201), (answer.status, await answer.text())


@pytest.fixture
async def krt(platform) -> AsyncIterator[Client]:
    async with Client(platform.config) as client:
        yield client


async def test_a_run_scales_out_from_zero_onto_a_pod_and_answers_through_the_gateway(platform, krt) -> None:
    assert platform.pods("kpy") == [], "minHosts 0: no pod before the first Run"
    await krt.create(Run.from_dict(manifest("hello", "kpy")))
    ready = await krt.wait("hello", timeout=60)
    assert ready.status.phase is RunPhase.Ready
    [pod] = platform.pods("kpy")
    assert pod["status"]["phase"] == "Running"
    answer = await invoke(krt, "hello", {"hi": 1})
    assert answer.ok and answer.outputs["echo"] == {"hi": 1}
    assert platform.kubelet.process(pod["metadata"]["name"]).pid != answer.outputs["pid"]
    hosts = await krt.hosts()
    [view] = [h for h in hosts if h.host.runtime == "kpy"]
    assert (
        view.host.hostUid == pod["metadata"]["uid"]
        and view.host.labels["kruntimes.io/provider"] == "kubernetes"
    )
    final = await krt.delete("hello")
    assert final.phase is RunPhase.Cancelled
    # idle past its scale-in delay, beyond minHosts 0: drained and deleted, its Secret with it
    await eventually(lambda: not platform.pods("kpy"), within=60, what="the idle pod scaled in")
    namespace = pod["metadata"]["namespace"]
    await eventually(
        lambda: (
            not [
                s
                for s in platform.cluster.secrets(namespace)
                if s["metadata"]["name"].startswith(pod["metadata"]["name"])
            ]
        ),
        within=20,
        what="its certificate Secret deleted",
    )


# What a function of a chart's host pod may do there, and what it sees of the pod's processes
# and of the node's uids.
PROBE = f"""
import os

def cmdline(pid):
    try:
        with open("/proc/" + pid + "/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""

def attempt(act):
    try:
        act()
    except OSError as e:
        return type(e).__name__
    return "done"

def handle(p):
    state = "{kpods.STATE_DIR}"
    try:
        hosts = os.listdir(state + "/work")
    except OSError:  # its mount namespace: not even the host's work directory is readable
        hosts = [""]
    return {{
        "uid": os.getuid(),
        "plant-in-state": attempt(lambda: os.makedirs(state + "/secrets/default/planted")),
        "write-root": attempt(lambda: open("/usr/planted", "w")),
        "read-host-key": attempt(lambda: open("{kpods.CERT_MOUNT}/tls.key").read()),
        "list-workspaces": attempt(lambda: os.listdir(state + "/work/" + hosts[0])),
        "write-tmp": attempt(lambda: open("/tmp/krt-probe", "w").close()),
        "tmp-mode": oct(os.stat("/tmp").st_mode & 0o7777),
        "secret": os.environ.get("DB_PASSWORD"),
        "read-secret-file": attempt(lambda: open(state + "/secrets/default/db/PASSWORD").read()),
        "read-bindings": attempt(lambda: open("{kpods.ROLE_BINDINGS_FILE}").read()),
        "processes": len([p for p in os.listdir("/proc") if p.isdigit()]),
        "sees-host": any(b"kruntimes.workers.krt" in cmdline(p) for p in os.listdir("/proc") if p.isdigit()),
        "uid-map": open("/proc/self/uid_map").read().split(),
    }}
"""


async def test_hosts_of_the_charts_pods_start_on_a_read_only_root_isolating_functions_as_each_setting_says(
    platform, krt
):
    """On a node that enforces the chart's security context and user namespaces
    (tests/kubernetes/node_test.py): the chart's default pod (a user namespace of its own) and its
    pod with hosts.userNamespaces false, a Run on each, both Ready and invoked. In the default pod
    a function has a PID namespace (it sees its own processes only, not the host) and runs as a
    uid of the pod's user namespace, an unprivileged node uid of the pod's range; without a user
    namespace it sees the pod's processes, the host among them, and runs as a node uid of the
    range the provider gave the pod. No node uid is in both pods' ranges. Either way a function
    writes only its workspace and /tmp (which the host made sticky), and reads neither the host's
    key, its role bindings and secrets, nor another workspace, nor plants a file in the host's
    state directory. The Run whose creator the chart's bindings name gets its secret."""
    if not platform.kubelet.contains:
        require_or_skip("the test node enforces a security context only as root, with overlayfs")
    names = {"chart-ns": "kchart", "chart-off": "kchart-off"}
    async with Client(platform.config.model_copy(update={"identity": CREATOR})) as creator:
        for name, runtime in names.items():
            probe = manifest(name, runtime, source=PROBE)
            probe["spec"]["envFrom"] = [{"secretRef": {"name": "db"}, "prefix": "DB_"}]
            await creator.create(Run.from_dict(probe))
    for name in names:
        assert (await krt.wait(name, timeout=60)).status.phase is RunPhase.Ready
    answers = {name: await invoke(krt, name, {"n": name}) for name in names}
    assert all(a.ok for a in answers.values()), answers
    seen = {name: a.outputs for name, a in answers.items()}
    for name, outputs in seen.items():
        # refused: EACCES, or in its own mount namespace also hidden (ENOENT) or read-only (EROFS)
        for refused in (
            "read-host-key",
            "plant-in-state",
            "list-workspaces",
            "read-secret-file",
            "read-bindings",
        ):
            assert outputs[refused] in ("PermissionError", "FileNotFoundError", "OSError"), (name, outputs)
        assert outputs["write-root"] == "OSError" and outputs["write-tmp"] == "done", (name, outputs)  # EROFS
        assert outputs["tmp-mode"] == oct(0o1777), (name, outputs)  # its /tmp, sticky
        assert outputs["secret"] == "hunter2-e2e", "the chart's bindings let its creator use db"
    own, shared = seen["chart-ns"], seen["chart-off"]
    assert not own["sees-host"] and own["processes"] <= 2, own  # its PID namespace
    assert shared["sees-host"], shared  # the pod's processes: no PID namespace without one
    [pod] = platform.pods("kchart")
    [other] = platform.pods("kchart-off")
    assert pod["spec"]["hostUsers"] is False and "hostUsers" not in other["spec"]
    for each in (pod, other):
        assert each["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    # the node's uids: through the default pod's user namespace (inside 0 → base), and the range
    # the provider gave the other pod on the node
    inside, base, count = (int(x) for x in own["uid-map"])
    assert inside == 0 and base >= 65536 and count == 65536, own["uid-map"]
    assert own["uid"] in UidRange.parse(kpods.USERNS_UID_RANGE)
    assert shared["uid-map"] == ["0", "0", "4294967295"], shared["uid-map"]
    node_range = UidRange.parse(other["metadata"]["annotations"][kpods.ANNOTATION_UID_RANGE])
    assert shared["uid"] in node_range
    assert base + own["uid"] != shared["uid"]
    assert base + count <= node_range.first or node_range.first + node_range.count <= base
    for name in names:
        await krt.delete(name)


async def test_every_failure_to_start_a_pod_fails_the_run_with_its_reason_and_leaves_no_pod(platform, krt):
    names = {runtime: f"fails-{runtime}" for runtime in [*FAULTS, *REFUSALS]}
    await asyncio.gather(*(krt.create(Run.from_dict(manifest(n, r))) for r, n in names.items()))

    async def failed(name: str):
        run = await krt.get(name)
        return run if run.status.phase is RunPhase.Failed else None

    expected = {**{r: reason for r, (_, reason) in FAULTS.items()}, **{r: v[3] for r, v in REFUSALS.items()}}
    for runtime, name in names.items():
        run = await eventually(lambda name=name: failed(name), within=120, what=f"{name} fails")
        assert expected[runtime] in run.status.message, (runtime, run.status.message)

    def left() -> list[str]:
        return [
            f"{p['metadata']['name']} {p['status'].get('phase')} {p['metadata'].get('deletionTimestamp')}"
            for p in platform.pods()
            if p["metadata"]["labels"]["kruntimes.io/runtime"] in names
        ]

    try:
        # a scale-out still in flight when its Run was rejected ends within its own bound too
        await eventually(lambda: not left(), within=40, what="no pod left behind")
    except AssertionError as e:
        raise AssertionError(f"left behind: {left()}") from e
    assert not [n for n in platform.kubelet.running() if any(n.startswith(r) for r in names)]
    refused = {p["metadata"]["labels"]["kruntimes.io/runtime"] for p in platform.cluster.refused}
    assert refused == set(REFUSALS)


async def test_a_pod_deleted_out_of_band_is_replaced_and_the_run_answers_at_the_same_url(platform, krt):
    await krt.create(Run.from_dict(manifest("recovers", "krecover")))
    ready = await krt.wait("recovers", timeout=60)
    first = await invoke(krt, "recovers", {"n": 1})
    assert first.ok
    [pod] = platform.pods("krecover")
    # what `kubectl delete pod` does: a graceful delete, the kubelet stops the container
    async with platform.kubelet._session.delete(
        f"{platform.api_url}/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"
    ) as answer:
        assert answer.status == 200

    async def answers_again():
        try:
            again = await krt.invoke("recovers", {"n": 2})
        except Exception:
            return None
        # until the old pod stops, answers may still come from it
        return again if again.ok and again.outputs["boot"] != first.outputs["boot"] else None

    await eventually(answers_again, within=60, what="the Run answers on a new pod")
    [new_pod] = platform.pods("krecover")
    assert new_pod["metadata"]["uid"] != pod["metadata"]["uid"]
    # its certificate was issued for it; the old pod's went with the old pod
    [secret] = [
        s
        for s in platform.cluster.secrets(platform.pods("krecover")[0]["metadata"]["namespace"])
        if "krecover" in s["metadata"]["name"]
    ]
    assert [o["uid"] for o in secret["metadata"]["ownerReferences"]] == [new_pod["metadata"]["uid"]]
    after = await krt.get("recovers")
    assert after.status.endpoint.url == ready.status.endpoint.url
    await krt.delete("recovers")


async def test_a_killed_host_is_replaced_and_its_ended_pod_deleted_at_once(platform, krt):
    """The host's process SIGKILLed (the pod fails: restartPolicy Never): the Run answers again on
    a new pod, and the fence deleted the failed pod with no grace rather than leaving it to the
    orphan collection (no Error pods pile up under a crash loop)."""
    await krt.create(Run.from_dict(manifest("killed", "krecover")))
    await krt.wait("killed", timeout=60)
    first = await invoke(krt, "killed", {"n": 1})
    [pod] = platform.pods("krecover")
    platform.kubelet.process(pod["metadata"]["name"]).kill()

    async def answers_again():
        try:
            again = await krt.invoke("killed", {"n": 2})
        except Exception:
            return None
        return again if again.ok and again.outputs["boot"] != first.outputs["boot"] else None

    await eventually(answers_again, within=60, what="the Run answers on a new pod")
    await eventually(
        lambda: (
            [p["metadata"]["uid"] for p in platform.pods("krecover")] != [pod["metadata"]["uid"]]
            and all(p["status"].get("phase") != "Failed" for p in platform.pods("krecover"))
        ),
        within=20,
        what="the failed pod deleted",
    )
    deletes = [
        r.data.get("gracePeriodSeconds")
        for r in platform.cluster["delete"]
        if r.resource is not None
        and r.resource.plural == "pods"
        and r.name == pod["metadata"]["name"]
        and (r.data.get("preconditions") or {}).get("uid") == pod["metadata"]["uid"]
    ]
    assert 0 in deletes, deletes
    await krt.delete("killed")


async def test_a_worker_killed_mid_create_is_replaced_by_one_that_adopts_the_pod(platform, krt, tmp_path):
    runtime = kubernetes_runtime("krestart", startTimeoutSeconds=40)
    platform.kubelet.hold.add("krestart")  # its pods wait in ContainerCreating until released
    log = tmp_path / "workers.log"
    first = platform.worker_process(runtimes=[runtime], queue="restart", control_plane="e2e-restart", log=log)
    second = None

    async def pool_runs() -> bool:
        try:
            described = await platform.temporal.get_workflow_handle("pool/krestart").describe()
        except Exception:
            return False
        return described.status is not None and described.status.name == "RUNNING"

    try:
        await eventually(pool_runs, within=60, what="the worker started its pool")
        await krt.create(Run.from_dict(manifest("adopted", "krestart")))
        await eventually(lambda: platform.pods("krestart"), within=60, what="the worker created the pod")
        stop_process(first, sig=signal.SIGKILL)  # dies mid-create: nothing cleans up after it
        [pod] = platform.pods("krestart")
        second = platform.worker_process(
            runtimes=[runtime], queue="restart", control_plane="e2e-restart", log=log
        )
        platform.kubelet.hold.discard("krestart")
        platform.kubelet.release()
        ready = await krt.wait("adopted", timeout=90)
        assert ready.status.phase is RunPhase.Ready
        assert [p["metadata"]["uid"] for p in platform.pods("krestart")] == [pod["metadata"]["uid"]]
        creates = [
            r
            for r in platform.cluster["post"]
            if r.resource is not None
            and r.resource.plural == "pods"
            and (r.data or {}).get("metadata", {}).get("labels", {}).get("kruntimes.io/runtime") == "krestart"
        ]
        assert len(creates) == 1, "the second worker adopted the pod instead of creating another"
        assert (await invoke(krt, "adopted", {})).ok
        # Two control planes share the namespace now (this platform's has a pod of kpy too): each
        # one's orphan collection, given the hosts its own pools know, deletes nothing of the other's.
        await krt.create(Run.from_dict(manifest("other-plane", "kpy")))
        await krt.wait("other-plane", timeout=60)
        before = {p["metadata"]["uid"] for p in platform.pods()}
        assert platform.pods("kpy") and platform.pods("krestart")
        for control_plane, runtimes in (("e2e", RUNTIMES), ("e2e-restart", [runtime])):
            swept = await collect_orphans(platform, control_plane=control_plane, runtimes=runtimes)
            assert swept.deleted == [] and swept.waiting == [], (control_plane, swept)
        assert {p["metadata"]["uid"] for p in platform.pods()} == before
        await krt.delete("other-plane")
        await krt.delete("adopted")
    finally:
        stop_process(first)
        if second is not None:
            stop_process(second)
