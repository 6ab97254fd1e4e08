"""Homes and the state directory's parent are hidden from functions by rule, whatever their mode:
a home of mode 0755 with a readable .bashrc, a project directory holding the state directory
beside the owner's other files."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.runtime.sandbox.policy import SandboxSettings
from tests.support.isolation import needing
from tests.support.pki import TestPKI
from tests.support.runtime_hosts import loopback_host

isolation_needed = needing(os.geteuid() == 0, "functions of their own uid need root")

PEEK = """
import os
def handle(paths):
    seen = []
    for path in paths:
        try:
            seen.append(sorted(os.listdir(path)) if os.path.isdir(path) else open(path).read())
        except OSError as e:
            seen.append(type(e).__name__)
    return {"seen": seen}
"""


@pytest.fixture
def readable_home() -> Iterator[Path]:
    """A user's home anybody may read, as many are."""
    home = Path("/home") / f"krt-test-{uuid.uuid4().hex[:8]}"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    (home / ".bashrc").write_text("export TOKEN=home-secret\n")
    (home / ".bashrc").chmod(0o644)
    try:
        yield home
    finally:
        shutil.rmtree(home)


@pytest.fixture
def project() -> Iterator[Path]:
    """A project directory, open to all, that holds the platform's state directory."""
    root = Path("/var/tmp") / f"krt-test-{uuid.uuid4().hex[:8]}"
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    (root / "notes.txt").write_text("project-secret")
    (root / "notes.txt").chmod(0o644)
    try:
        yield root
    finally:
        shutil.rmtree(root)


def test_homes_and_the_state_directorys_parent_are_hidden_whatever_their_mode(
    pki: TestPKI, readable_home: Path, project: Path
) -> None:
    host = loopback_host(pki, project / "state", host_id="homes-0", sandbox=SandboxSettings())
    address = host.start()
    channel = pki.channel(address, as_=pki.control_plane)
    try:
        stub = pb_grpc.FunctionRuntimeStub(channel)
        run = pb.RunRef(
            run_uid=str(uuid.uuid4()), attempt=1, namespace="default", name="fn", runtime="python"
        )
        config = pb.FunctionConfig(
            adapter="python",
            handler="main:handle",
            inline=pb.InlineSource(files=[pb.InlineFile(name="main.py", content=PEEK.encode())]),
        )
        signed = pki.sign(run_uid=run.run_uid, attempt=1, host_id="homes-0", host_uid=host.host_uid)
        registration = stub.RegisterFunction(
            pb.RegisterFunctionRequest(run=run, config=config, assignment=signed), timeout=60
        )
        paths = ["/home", str(readable_home / ".bashrc"), "/root", str(project), str(project / "notes.txt")]
        answer = pb_grpc.FunctionRuntimeStub(pki.channel(address, as_=pki.gateway)).InvokeFunction(
            pb.InvokeFunctionRequest(
                registration_id=registration.registration_id,
                payload=json.dumps(paths).encode(),
                timeout_ms=20_000,
            ),
            timeout=30,
        )
        assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED, answer.error.message
        seen = dict(zip(paths, json.loads(answer.outputs_json)["seen"], strict=True))
        assert seen["/home"] in ([], "PermissionError"), "no home is listed"
        assert seen["/root"] in ([], "PermissionError")
        assert seen[str(readable_home / ".bashrc")] == "FileNotFoundError"
        assert seen[str(project)] in ([], "PermissionError")
        assert seen[str(project / "notes.txt")] == "FileNotFoundError"
    finally:
        channel.close()
        host.stop(grace_s=1)
