"""Functions that share their host's mounts share its /tmp: a real `krt host` in a container with
the chart's host pod's security context (root, no CAP_SYS_ADMIN: no mount namespaces for its
functions) and a /tmp as a kubelet makes an emptyDir (mode 0777, no sticky bit). The host makes
it sticky at start, so one function (its own uid) cannot delete or replace a file another left
there, yet writes its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kruntimes.pki import ASSIGNMENT_PUBLIC_KEY
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.runtime.sandbox.identity import DEFAULT_LOCK_DIR
from tests.kubernetes.cluster import CONTAINER_RUNTIME, can_contain
from tests.support.isolation import require_or_skip
from tests.support.pki import TestPKI
from tests.support.waiting import eventually_blocking

HOST_ID = "shared-tmp-0"
STATE, TLS = "/var/lib/kruntimes", "/etc/kruntimes/tls"
# The chart's host pod (helm/kruntimes/values.yaml hosts.podTemplate) less NET_ADMIN, so the
# host writes no packet rules in the node's network namespace, which this container shares.
SECURITY = {
    "runAsUser": 0,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {
        "drop": ["ALL"],
        "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETPCAP", "SETUID"],
    },
}
SOURCE = """
import os

def attempt(act):
    try:
        act()
    except OSError as e:
        return type(e).__name__
    return "done"

def replace():
    open("/tmp/own", "w").close()
    os.rename("/tmp/own", "/tmp/left")

def handle(p):
    if p["do"] == "leave":
        with open("/tmp/left", "w") as f:
            f.write("mine")
        return {"uid": os.getuid()}
    return {
        "uid": os.getuid(),
        "delete": attempt(lambda: os.unlink("/tmp/left")),
        "replace": attempt(replace),
        "write-own": attempt(lambda: open("/tmp/own-2", "w").close()),
    }
"""


def start_container(root: Path, pki: TestPKI, tmp: Path, state: Path) -> subprocess.Popen[bytes]:
    """`krt host` as the test node runs a container (tests/kubernetes/container.py)."""
    argv = [
        sys.executable,
        "-m",
        "kruntimes.workers.krt",
        "host",
        "--host-id",
        HOST_ID,
        "--runtime",
        "python",
    ]
    argv += ["--listen", "127.0.0.1:0", "--invoke-listen", "", "--network", "host"]
    argv += ["--state-dir", f"{STATE}/host", "--ready-file", f"{STATE}/ready.json"]
    argv += ["--peer-tls", TLS, "--assignment-public-key", f"{TLS}/{ASSIGNMENT_PUBLIC_KEY}"]
    os.makedirs(DEFAULT_LOCK_DIR, mode=0o700, exist_ok=True)  # the machine's uid locks: shared
    mounts = [
        {"source": str(tmp), "target": "/tmp", "readOnly": False},
        {"source": str(state), "target": STATE, "readOnly": False},
        {"source": str(pki.host_dir(HOST_ID)), "target": TLS, "readOnly": True},
        {"source": DEFAULT_LOCK_DIR, "target": DEFAULT_LOCK_DIR, "readOnly": False},
    ]
    scratch = root / "scratch"
    scratch.mkdir()
    spec = {
        "argv": argv,
        "env": {k: v for k, v in os.environ.items() if not k.startswith("KRT_")},
        "cwd": os.getcwd(),
        "scratch": str(scratch),
        "reachable": sorted({sys.base_prefix, sys.prefix, os.getcwd()}),
        "mounts": mounts,
        "hostname": HOST_ID,
        "securityContext": SECURITY,
    }
    (root / "spec.json").write_text(json.dumps(spec))
    with open(root / "host.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", str(CONTAINER_RUNTIME), str(root / "spec.json")],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the container passes it on), SIGKILL after a bound (its process dies with it)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture
def host(tmp_path: Path, pki: TestPKI) -> Iterator[tuple[dict[str, Any], Path]]:
    if not can_contain():
        require_or_skip("a container of the test node needs root, namespaces and overlayfs")
    tmp, state = tmp_path / "tmp", tmp_path / "state"
    for volume in (tmp, state):
        volume.mkdir()
        volume.chmod(0o777)  # as a kubelet makes an emptyDir
    process = start_container(tmp_path, pki, tmp, state)
    try:
        ready = state / "ready.json"
        eventually_blocking(
            lambda: ready.exists() or process.poll() is not None, within=60, what="the host serves"
        )
        assert process.poll() is None, (tmp_path / "host.log").read_text()[-4000:]
        yield json.loads(ready.read_text()), tmp
    finally:
        stop(process)


def test_a_function_cannot_delete_what_another_left_in_the_shared_tmp(
    host: tuple[dict[str, Any], Path], pki: TestPKI
) -> None:
    ready, tmp = host
    assert "shared mounts" in ready["isolation"] and "own uid per function" in ready["isolation"]
    assert oct(tmp.stat().st_mode & 0o7777) == oct(0o1777), "the host made the pod's /tmp sticky"
    state = (
        tmp.parent / "state"
    )  # the state volume's root, 0777 as an emptyDir: no function renames the state aside
    assert oct(state.stat().st_mode & 0o7777) == oct(0o775), "the host closed it to others' writes"
    with (
        pki.channel(ready["address"], as_=pki.control_plane) as control,
        pki.channel(ready["address"], as_=pki.gateway) as gateway,
    ):

        def register() -> str:
            run = pb.RunRef(
                run_uid=str(uuid.uuid4()), attempt=1, namespace="default", name="fn", runtime="python"
            )
            config = pb.FunctionConfig(
                adapter="python",
                handler="main:handle",
                inline=pb.InlineSource(files=[pb.InlineFile(name="main.py", content=SOURCE.encode())]),
            )
            signed = pki.sign(run_uid=run.run_uid, attempt=1, host_id=HOST_ID, host_uid=ready["hostUid"])
            request = pb.RegisterFunctionRequest(run=run, config=config, assignment=signed)
            answer = pb_grpc.FunctionRuntimeStub(control).RegisterFunction(request, timeout=60)
            return answer.registration_id

        def invoke(registration: str, payload: dict[str, Any]) -> dict[str, Any]:
            answer = pb_grpc.FunctionRuntimeStub(gateway).InvokeFunction(
                pb.InvokeFunctionRequest(registration_id=registration, payload=json.dumps(payload).encode()),
                timeout=30,
            )
            assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED, answer.error.message
            result: dict[str, Any] = json.loads(answer.outputs_json)
            return result

        owner, other = register(), register()
        left = invoke(owner, {"do": "leave"})
        tried = invoke(other, {"do": "delete"})
    assert left["uid"] != tried["uid"], "each function its own uid"
    assert tried["delete"] == "PermissionError" and tried["replace"] == "PermissionError", tried
    assert tried["write-own"] == "done", tried
    assert (tmp / "left").read_text() == "mine" and (tmp / "left").stat().st_uid == left["uid"]
