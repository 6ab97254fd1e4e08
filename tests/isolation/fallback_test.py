"""What a host does where a mechanism of isolation is unavailable: it refuses what it cannot
honour, says what is in force, and falls back as documented (runtime/sandbox/policy.py)."""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from pathlib import Path

import pytest

from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.runtime.isolation import FunctionIsolation
from kruntimes.runtime.sandbox import shared_tmp
from kruntimes.runtime.sandbox.policy import Isolation, IsolationUnavailable, Network, SandboxSettings
from tests.support.pki import TestPKI
from tests.support.runtime_hosts import loopback_host


def _isolation(settings: SandboxSettings, *, switch: bool) -> FunctionIsolation:
    return FunctionIsolation(settings, host_uid="h", hide=(), keep=(), switch_uids=lambda: switch)


def test_a_host_that_cannot_switch_uids_refuses_uid_isolation_and_says_how_to_run() -> None:
    with pytest.raises(IsolationUnavailable, match="--isolation same-user"):
        _isolation(SandboxSettings(), switch=False).check()


def test_same_user_isolation_starts_where_uids_cannot_be_switched(tmp_path: Path) -> None:
    isolation = _isolation(SandboxSettings(isolation=Isolation.SAME_USER), switch=False)
    in_force = isolation.start(namespaces=False, network_namespaces=False, work_root=tmp_path)
    assert in_force.isolation is Isolation.SAME_USER
    assert "same user as the host" in in_force.describe()
    assert isolation.pool is None, "no uid is claimed"


def test_without_mount_namespaces_a_uid_needs_a_traversable_way_to_its_workspace(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    work = closed / "work"
    work.mkdir()
    with pytest.raises(IsolationUnavailable, match="traversable"):
        _isolation(SandboxSettings(), switch=True).start(
            namespaces=False, network_namespaces=False, work_root=work
        )


def test_without_namespaces_the_host_says_so_and_relies_on_the_uid(tmp_path: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="krt-open-work-", dir="/tmp"))  # every ancestor o+x
    work.chmod(0o711)
    # network host: outbound's packet rules need CAP_NET_ADMIN, which a test without root lacks
    settings = SandboxSettings(network=Network.HOST, lock_dir=str(tmp_path / "uids"))
    isolation = _isolation(settings, switch=True)
    try:
        in_force = isolation.start(namespaces=False, network_namespaces=False, work_root=work)
    finally:
        isolation.close()
        work.rmdir()
    assert not in_force.pid_namespace and not in_force.mount_namespace
    assert "no PID namespace" in in_force.describe()


def test_network_none_is_refused_where_network_namespaces_cannot_be_made(tmp_path: Path) -> None:
    with pytest.raises(IsolationUnavailable, match="network: none"):
        _isolation(SandboxSettings(network=Network.NONE, isolation=Isolation.SAME_USER), switch=False).start(
            namespaces=False, network_namespaces=False, work_root=tmp_path
        )


def test_an_explicit_same_user_host_runs_functions_as_itself_and_reports_it(
    tmp_path: Path, pki: TestPKI
) -> None:
    host = loopback_host(
        pki, tmp_path / "state", host_id="same-0", sandbox=SandboxSettings(isolation=Isolation.SAME_USER)
    )
    address = host.start()
    try:
        with (
            pki.channel(address, as_=pki.control_plane) as control,
            pki.channel(address, as_=pki.gateway) as gw,
        ):
            stub = pb_grpc.FunctionRuntimeStub(control)
            info = stub.HostInfo(pb.HostInfoRequest(), timeout=10)
            assert info.isolation.isolation == "same-user" and info.isolation.summary
            run = pb.RunRef(
                run_uid=str(uuid.uuid4()), attempt=1, namespace="default", name="fn", runtime="python"
            )
            source = pb.InlineFile(
                name="main.py",
                content=b"import os\n"
                b"def handle(p):\n"
                b"    status = open('/proc/self/status').read().split('Seccomp:')[1].split()[0]\n"
                b"    return [os.getuid(), status]\n",
            )
            reg = stub.RegisterFunction(
                pb.RegisterFunctionRequest(
                    run=run,
                    config=pb.FunctionConfig(
                        adapter="python", handler="main:handle", inline=pb.InlineSource(files=[source])
                    ),
                    assignment=pki.sign(
                        run_uid=run.run_uid, attempt=1, host_id="same-0", host_uid=host.host_uid
                    ),
                ),
                timeout=30,
            )
            answer = pb_grpc.FunctionRuntimeStub(gw).InvokeFunction(
                pb.InvokeFunctionRequest(registration_id=reg.registration_id), timeout=30
            )
            uid, seccomp_mode = json.loads(answer.outputs_json)["result"]
            assert uid == os.geteuid(), "it runs as the host's user"
            assert seccomp_mode == "2" and "no syscall filter" not in info.isolation.summary, "and filtered"
    finally:
        host.stop(grace_s=1)


def test_without_mount_namespaces_no_ancestor_of_the_state_lets_others_rename_it(tmp_path: Path) -> None:
    """A pod's emptyDir root is 0777: a function sharing the host's mounts could rename the state
    directory aside and put its own there. Sticky directories (/tmp) need nothing."""
    volume, sticky = tmp_path / "volume", tmp_path / "volume" / "sticky"
    work = sticky / "state" / "work"
    work.mkdir(parents=True)
    volume.chmod(0o777)
    sticky.chmod(0o1777)
    changed, problems = shared_tmp.close_ancestors(work)
    assert (changed, problems) == ([str(volume)], [])
    assert [oct(d.stat().st_mode & 0o7777) for d in (volume, sticky)] == [oct(0o775), oct(0o1777)]
    assert shared_tmp.close_ancestors(work) == ([], []), "once is enough"
