"""The test node runs a pod's containers as a node does (cluster.py, container.py): PID 1 of a PID
namespace of its own, the container's security context applied — a read-only root file system but
its writable volumes, capabilities, no_new_privs, uid and gid — secret volumes in the kubelet's
atomic-writer layout, following their Secret, and for a pod of `hostUsers: false` a user namespace
of its own with idmapped volumes, on an address of its own. The host pods' own tests depend on it."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

from tests.kubernetes.conftest import IMAGE, NAMESPACE
from tests.support.isolation import require_or_skip
from tests.support.waiting import eventually

# What the container's process finds: each line `name value`, into its writable volume ($$ is
# Kubernetes' escape of $; the node's pid of this test is not a process the pod can see).
PROBE = r"""
try() { "$@" 2>/dev/null && echo 0 || echo 1; }
{
echo pid $$$$
echo node-process $(try test -e /proc/NODE_PID)
echo root $(try touch /krt-probe)
echo tmp $(try touch /tmp/krt-probe)
echo var-tmp $(try touch /var/tmp/krt-probe)
echo secret $(try touch /etc/probe-secret/new)
echo volume $(try touch /out/written)
echo uid $(id -u)
echo gid $(id -g)
echo capabilities $(grep CapBnd /proc/self/status | cut -f2)
echo no-new-privs $(grep NoNewPrivs /proc/self/status | cut -f2)
} > /out/probe
""".replace("NODE_PID", str(os.getpid()))


async def _api(env, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
    async with env.kubelet._session.request(
        method, f"{env.url}/api/v1/namespaces/{NAMESPACE}/{path}", json=body, headers=headers
    ) as answer:
        assert answer.status in (200, 201), (answer.status, await answer.text())
        return await answer.json()


def _secret(name: str, value: bytes) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "data": {"key": base64.b64encode(value).decode()},
    }


def _pod(name: str, script: str, security: dict[str, Any] | None) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": IMAGE,
        "command": ["/bin/sh", "-c", script],
        "volumeMounts": [
            {"name": "out", "mountPath": "/out"},
            {"name": "secret", "mountPath": "/etc/probe-secret", "readOnly": True},
        ],
    }
    if security is not None:
        container["securityContext"] = security
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "containers": [container],
            "volumes": [
                {"name": "out", "emptyDir": {}},
                {"name": "secret", "secret": {"secretName": f"{name}-secret", "defaultMode": 0o400}},
            ],
        },
    }


def _volume(env, pod: dict[str, Any], name: str) -> Path:
    directory = env.kubelet.root / f"{pod['metadata']['name']}-{pod['metadata']['uid'][:8]}"
    return directory / "volumes" / name


async def _ended(env, name: str) -> dict[str, Any]:
    async def ended():
        [pod] = [p for p in env.pods() if p["metadata"]["name"] == name]
        return pod if pod["status"].get("phase") in ("Succeeded", "Failed") else None

    return await eventually(ended, within=30, what=f"pod {name} ends")


async def test_a_containers_security_context_is_enforced(env) -> None:
    if not env.kubelet.contains:
        require_or_skip("the test node runs containers only as root, with overlayfs")
    security = {
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["KILL", "SETUID"]},
        "runAsUser": 4321,
        "runAsGroup": 4321,
    }
    await _api(env, "POST", "secrets", _secret("strict-secret", b"s3cret"))
    await _api(env, "POST", "pods", _pod("strict", PROBE, security))
    pod = await _ended(env, "strict")
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    seen = dict(line.split(" ", 1) for line in (_volume(env, pod, "out") / "probe").read_text().splitlines())
    assert seen["pid"] == "1" and seen["node-process"] == "1", "a PID namespace of its own"
    assert (seen["root"], seen["tmp"], seen["var-tmp"], seen["secret"]) == ("1", "1", "1", "1"), seen
    assert seen["volume"] == "0" and (_volume(env, pod, "out") / "written").exists()
    assert (seen["uid"], seen["gid"]) == ("4321", "4321")
    assert int(seen["capabilities"], 16) == (1 << 5) | (1 << 7), "KILL and SETUID only"
    assert seen["no-new-privs"] == "1"
    assert not Path("/krt-probe").exists() and not Path("/var/tmp/krt-probe").exists()

    # The same pod asking for nothing runs with the node's privileges, on a root of its own.
    await _api(env, "POST", "secrets", _secret("lenient-secret", b"s3cret"))
    await _api(env, "POST", "pods", _pod("lenient", PROBE, None))
    pod = await _ended(env, "lenient")
    seen = dict(line.split(" ", 1) for line in (_volume(env, pod, "out") / "probe").read_text().splitlines())
    assert (seen["root"], seen["uid"], seen["no-new-privs"]) == ("0", "0", "0"), seen
    assert not Path("/krt-probe").exists(), "what it wrote stayed in its own root"


async def test_a_secret_volume_is_written_and_updated_as_the_kubelets_atomic_writer_does(env) -> None:
    await _api(env, "POST", "secrets", _secret("atomic-secret", b"one"))
    await _api(env, "POST", "pods", _pod("atomic", "sleep 60", None))

    def projected() -> dict[str, Any] | None:
        found = [p for p in env.pods() if p["metadata"]["name"] == "atomic"]
        if not found or found[0]["status"].get("phase") != "Running":
            return None
        return found[0] if (_volume(env, found[0], "secret") / "key").exists() else None

    pod = await eventually(projected, within=30, what="the secret volume written")
    volume = _volume(env, pod, "secret")
    link, data = volume / "key", volume / "..data"
    assert link.is_symlink() and str(link.readlink()) == "..data/key"
    assert data.is_symlink() and data.readlink().name.startswith("..")
    first = data.readlink()
    assert link.read_bytes() == b"one" and (volume / first / "key").stat().st_mode & 0o777 == 0o400

    await _api(env, "PATCH", "secrets/atomic-secret", {"data": {"key": base64.b64encode(b"two").decode()}})
    await eventually(lambda: link.read_bytes() == b"two", what="the volume follows the Secret")
    assert data.readlink() != first and not (volume / first).exists(), "swapped at once, the old one removed"
    await _api(env, "DELETE", "pods/atomic", {"gracePeriodSeconds": 0})


# What a container of a `hostUsers: false` pod finds, into its writable volume.
USERNS_PROBE = r"""
try() { "$@" >/dev/null 2>&1 && echo 0 || echo 1; }
{
echo map $(cat /proc/self/uid_map)
echo uid $(id -u)
echo secret $(cat /etc/probe-secret/key)
echo node-secret $(try head -c1 /etc/shadow)
echo address $(ip -4 -o address show dev eth0 | awk '{print $4}')
echo processes $(unshare --pid --fork --mount-proc sh -c 'ls /proc' | grep -c '^[0-9]')
} > /out/probe
touch /out/written
"""


async def test_a_pod_of_host_users_false_runs_as_root_of_a_user_namespace_of_its_own_on_its_own_address(
    env,
) -> None:
    """Each such pod: the node's uids of a range no other pod has (65,536 from its root), its
    root no root of the node (the node's /etc/shadow closed to it) but of the namespaces it makes
    (a PID namespace with its own /proc), its volumes idmapped (the Secret's 0400 file, the node
    root's, is its root's; what it writes is the node's root's on the node), and an address of its
    own, the pod's podIP."""
    if not env.kubelet.contains:
        require_or_skip("the test node runs containers only as root, with overlayfs")
    seen, pods = {}, {}
    for name in ("userns-a", "userns-b"):
        await _api(env, "POST", "secrets", _secret(f"{name}-secret", b"s3cret"))
        pod = _pod(name, USERNS_PROBE, None)
        pod["spec"]["hostUsers"] = False
        await _api(env, "POST", "pods", pod)
    for name in ("userns-a", "userns-b"):
        pods[name] = pod = await _ended(env, name)
        assert pod["status"]["phase"] == "Succeeded", pod["status"]
        out = _volume(env, pod, "out")
        seen[name] = dict(line.split(" ", 1) for line in (out / "probe").read_text().splitlines())
        assert (out / "written").stat().st_uid == 0, "idmapped: the pod's root is the node's root on disk"
    ranges = []
    for name, found in seen.items():
        inside, base, count = (int(x) for x in found["map"].split())
        assert (inside, count) == (0, 65536) and base > 0, found
        ranges.append(range(base, base + count))
        assert found["uid"] == "0" and found["secret"] == "s3cret", found
        assert found["node-secret"] == "1", "the pod's root is no root of the node"
        assert int(found["processes"]) <= 3, found  # its own PID namespace, made by the pod's root
        assert found["address"].split("/")[0] == pods[name]["status"]["podIP"] != "127.0.0.1", found
    assert not set(ranges[0]) & set(ranges[1])
    assert seen["userns-a"]["address"] != seen["userns-b"]["address"]
