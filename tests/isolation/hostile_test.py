"""Hostile functions: each attempt fails, and the host and the other function go on answering
(the autouse fixture in conftest.py checks that after every test)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.runtime.limits import ProcessLimits
from kruntimes.runtime.sandbox import seccomp
from kruntimes.runtime.sandbox.identity import present, processes_of
from tests.isolation import probes
from tests.isolation.conftest import (
    ATTACKER,
    FILE_LIMIT,
    PROCESS_LIMIT,
    SECRET,
    STATE_SECRETS,
    Function,
    HostUnderAttack,
)
from tests.support.isolation import needing
from tests.support.pki import TestPKI
from tests.support.runtime_hosts import loopback_host
from tests.support.waiting import wait_until

isolation_needed = needing(os.geteuid() == 0, "needs root: see tests/isolation/fallback_test.py")


def _read(attacker: Function, paths: list[str]) -> dict[str, str]:
    return attacker.run(probes.read(paths))  # type: ignore[no-any-return]


def test_a_function_runs_as_its_own_unprivileged_uid_without_capabilities(
    attacker: Function, victim: Function
) -> None:
    seen = attacker.run(probes.IDENTITY)
    assert seen["uid"] == attacker.uid and seen["uid"] != 0 and seen["uid"] != victim.uid
    assert seen["gid"] == attacker.uid and seen["groups"] == []
    assert seen["caps"] == ["0000000000000000"] * 4
    assert seen["no_new_privs"] == "1" and not seen["regained"]


def test_the_state_directory_and_its_secrets_are_out_of_reach(
    attacker: Function, target: HostUnderAttack
) -> None:
    paths = [str(target.state_dir / name) for name in STATE_SECRETS]
    found = _read(attacker, [*paths, str(target.state_dir)])
    for path in paths:
        assert found[path] in ("FileNotFoundError", "PermissionError"), path
    listing = attacker.run(probes.listdir(str(target.state_dir)))
    assert listing in ("FileNotFoundError", "PermissionError", [])


def test_a_source_path_cannot_name_the_state_directory(target: HostUnderAttack) -> None:
    config = pb.FunctionConfig(
        adapter="python", handler="main:handle", source_path=str(target.state_dir / "tls")
    )
    with pytest.raises(grpc.RpcError) as err:
        target.stub.RegisterFunction(target.registration(config))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_another_functions_workspace_and_memory_are_out_of_reach(
    attacker: Function, victim: Function
) -> None:
    workspace = victim.workdir
    found = _read(attacker, [str(workspace / "main.py")])
    assert found[str(workspace / "main.py")] in ("FileNotFoundError", "PermissionError")
    pids = victim.pids
    proc_paths = [f"/proc/{pid}/{what}" for pid in pids for what in ("environ", "mem", "cmdline", "maps")]
    found = _read(attacker, proc_paths)
    assert all(
        value in ("FileNotFoundError", "PermissionError", "ProcessLookupError") for value in found.values()
    ), found
    assert SECRET not in str(found)


def test_the_host_and_the_platform_are_invisible_in_proc(attacker: Function, target: HostUnderAttack) -> None:
    visible = attacker.run("import os\nresult = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())")
    assert visible == [visible[0]] and visible[0] < 10, f"only its own process shows: {visible}"
    found = _read(
        attacker, [f"/proc/{os.getpid()}/environ", f"/proc/{os.getpid()}/cmdline", "/proc/1/environ"]
    )
    assert all(value in ("FileNotFoundError", "PermissionError") for value in found.values()), found


def test_signals_to_the_host_the_zygote_and_another_function_fail(
    attacker: Function, victim: Function, target: HostUnderAttack
) -> None:
    zygote = target.runtime.spawner.zygote_pid
    assert zygote is not None
    pids = [os.getpid(), zygote, *victim.pids, 1]
    outcome = attacker.run(probes.signal(pids))
    assert all(value[0] != "sent" for pid, value in outcome.items() if pid != "1"), outcome
    assert all(value[1] != "attached" for value in outcome.values()), outcome
    assert zygote == target.runtime.spawner.zygote_pid and os.path.exists(f"/proc/{zygote}")


def test_forking_past_the_limit_is_refused_and_leaves_nothing_behind(attacker: Function) -> None:
    made = attacker.run(
        """
import os, time
made = 0
for _ in range(1000):
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        made += 1
    except OSError:
        break
result = made
""",
        timeout_ms=30_000,
    )
    assert 0 < made < PROCESS_LIMIT
    uid = attacker.uid
    assert len(processes_of(uid)) <= PROCESS_LIMIT


def test_memory_past_the_limit_across_several_children_ends_that_invocation_only(attacker: Function) -> None:
    answer = attacker.invoke(
        {
            "code": (
                "import os, time\n"
                "pids = []\n"
                "for _ in range(4):\n"
                "    pid = os.fork()\n"
                "    if pid == 0:\n"
                "        block = bytearray(48 * 1024 * 1024)\n"
                "        for i in range(0, len(block), 4096): block[i] = 1\n"
                "        time.sleep(30)\n"
                "        os._exit(0)\n"
                "    pids.append(pid)\n"
                "codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]\n"
                "result = codes\n"
            )
        },
        timeout_ms=40_000,
    )
    # 4 × 48 MiB > the 128 MiB limit: the kernel kills a child, or the function process itself
    if answer.status == pb.INVOCATION_STATUS_SUCCEEDED:
        codes = json.loads(answer.outputs_json)["result"]
        assert -9 in codes, f"the kernel killed a child for memory: {codes}"
    else:
        assert answer.status == pb.INVOCATION_STATUS_PROCESS_EXITED, answer.error
    assert attacker.answers(), "the function serves its next invocation"


# The invocation answers once the escape is complete: the middle child has ended (reaped) and
# the grandchild, in a session of its own, has said so through the pipe. Counting processes
# while the middle child is still exiting would race with it. `p["then_sleep"]`: the handler
# then sleeps that long (past its invocation's timeout).
ESCAPE = """
import os, time
def handle(p):
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, b"%d %d" % (os.getpid(), os.getsid(0)))
            time.sleep(300)
        os._exit(0)
    os.close(w)
    os.waitpid(middle, 0)
    pid, sid = map(int, os.read(r, 64).split())
    time.sleep(p.get("then_sleep", 0))
    return {"pid": pid, "sid": sid, "own_sid": os.getsid(0)}
"""


def _escaped(function: Function) -> list[int]:
    """Invoke `function` (ESCAPE); the host pids of its process and of the escaped grandchild."""
    answer = function.invoke({})
    assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED, (answer.error.type, answer.error.message)
    escaped = json.loads(answer.outputs_json)
    assert escaped["sid"] != escaped["own_sid"], "the grandchild runs in a session of its own"
    pids = processes_of(function.uid)
    assert len(pids) == 2, "the function process and the escaped grandchild"
    assert sorted(present(function.uid)) == sorted(pids), "both found however they are (not dumpable)"
    return pids


def test_a_process_that_escapes_with_setsid_and_a_double_fork_dies_on_unregister(
    target: HostUnderAttack,
) -> None:
    function = target.register(ESCAPE)
    _escaped(function)
    uid = function.uid
    target.stub.UnregisterFunction(
        pb.UnregisterFunctionRequest(registration_id=function.registration_id, grace_ms=100), timeout=30
    )
    assert present(uid) == [], "nothing of the function outlives its unregistration, not even a zombie"


def test_a_process_that_escapes_dies_with_an_invocation_that_times_out(target: HostUnderAttack) -> None:
    function = target.register(ESCAPE)
    try:
        first = _escaped(function)
        answer = function.invoke({"then_sleep": 60}, timeout_ms=1_000)
        assert answer.status == pb.INVOCATION_STATUS_TIMED_OUT, answer.status
        assert wait_until(lambda: not set(first) & set(processes_of(function.uid))), (
            "the timed-out function process and everything it escaped to are killed"
        )
        assert function.invoke({}).status == pb.INVOCATION_STATUS_SUCCEEDED, "the function serves again"
    finally:
        target.stub.UnregisterFunction(
            pb.UnregisterFunctionRequest(registration_id=function.registration_id, grace_ms=100), timeout=30
        )


@contextlib.contextmanager
def own_host(tmp_path: Path, pki: TestPKI, host_id: str, **options: Any) -> Iterator[HostUnderAttack]:
    """A host of this test's own (`options`: its HostOptions), stopped after."""
    runtime = loopback_host(pki, tmp_path, host_id=host_id, **options)
    address = runtime.start()
    try:
        with (
            pki.channel(address, as_=pki.control_plane) as control,
            pki.channel(address, as_=pki.gateway) as gateway,
            socket.create_server(("127.0.0.1", 0)) as listener,
        ):
            stubs = pb_grpc.FunctionRuntimeStub(control), pb_grpc.FunctionRuntimeStub(gateway)
            yield HostUnderAttack(runtime, *stubs, pki, tmp_path, listener)
    finally:
        runtime.stop(grace_s=1)


def test_a_process_that_escapes_dies_when_its_host_stops(tmp_path: Path, pki: TestPKI) -> None:
    with own_host(tmp_path, pki, "stopped-0") as host:
        function = host.register(ESCAPE)
        _escaped(function)
        uid = function.uid
    assert present(uid) == [], "nothing of a function outlives its host, not even a zombie"


def test_spinning_past_the_cpu_time_limit_ends_that_invocation_only(tmp_path: Path, pki: TestPKI) -> None:
    with own_host(tmp_path, pki, "spun-0", limits=ProcessLimits(cpu_seconds=1)) as host:
        spinner = host.register(ATTACKER)
        answer = spinner.invoke({"code": "while True:\n    pass\n"}, timeout_ms=60_000)
        assert answer.status == pb.INVOCATION_STATUS_PROCESS_EXITED, answer.status
        assert host.answers(), "the host must still answer"
        assert spinner.answers(), "the function serves its next invocation in a new process"


def test_writing_past_the_file_size_limit_fails_that_write(attacker: Function) -> None:
    outcome = attacker.run(
        f"""
import signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
try:
    with open("big", "wb") as f:
        f.write(b"x" * ({FILE_LIMIT} + 1024 * 1024))
    result = "written"
except OSError as exc:
    result = type(exc).__name__
"""
    )
    assert outcome == "OSError", "EFBIG: the write past the limit fails, the host is untouched"


def test_in_network_none_no_port_of_the_machine_is_reachable(
    attacker: Function, target: HostUnderAttack
) -> None:
    ports = [int(target.runtime.address.rsplit(":", 1)[1]), target.listener.getsockname()[1]]
    if target.runtime.invoke_address:
        ports.append(int(target.runtime.invoke_address.rsplit(":", 1)[1]))
    outcome = attacker.run(probes.connect([("127.0.0.1", port) for port in ports]))
    assert all(value != "connected" for value in outcome.values()), outcome


def test_the_function_sees_only_its_own_env_and_no_inherited_descriptors(attacker: Function) -> None:
    seen = attacker.run(
        """
import os
result = {"env": sorted(os.environ), "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd"))}
"""
    )
    assert set(seen["env"]) <= {
        "PATH",
        "HOME",
        "LANG",
        "TMPDIR",
        "KRT_RUN_UID",
        "KRT_ATTEMPT",
        "KRT_NAMESPACE",
        "KRT_RUN_NAME",
        "KRT_RUNTIME",
        "LC_CTYPE",
    }, seen["env"]
    assert max(seen["fds"]) <= 4, f"stdin, stdout, stderr, its control socket (+ the listing): {seen['fds']}"


def _inline(name: str, content: str, *, executable: bool = False) -> pb.InlineSource:
    return pb.InlineSource(files=[pb.InlineFile(name=name, content=content.encode(), executable=executable)])


def test_a_bash_function_gets_the_same_sandbox(target: HostUnderAttack) -> None:
    secret_file = target.state_dir / "tokens.csv"
    script = (
        "#!/bin/bash\n"
        f"cat {secret_file} >/dev/null 2>&1 && leaked=yes || leaked=no\n"
        'echo "{\\"uid\\": $(id -u), \\"leaked\\": \\"$leaked\\", \\"procs\\": $(ls /proc | grep -c \'^[0-9]\')}"\n'
    )
    config = pb.FunctionConfig(
        adapter="bash", handler="run.sh", inline=_inline("run.sh", script, executable=True)
    )
    reg = target.stub.RegisterFunction(target.registration(config), timeout=30)
    answer = target.gateway.InvokeFunction(
        pb.InvokeFunctionRequest(registration_id=reg.registration_id), timeout=30
    )
    assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED, answer.error
    seen = json.loads(answer.outputs_json)
    assert seen["uid"] != 0 and seen["leaked"] == "no"
    assert seen["procs"] <= 4, "bash, its subshells and ls: nothing of the host"


def test_a_task_gets_the_same_sandbox(target: HostUnderAttack) -> None:
    secret_file = target.state_dir / "tls" / "tls.key"
    code = (
        "import os\n"
        "def run(p):\n"
        "    try:\n"
        f"        open({str(secret_file)!r}).read()\n"
        "        leaked = True\n"
        "    except OSError:\n"
        "        leaked = False\n"
        "    return {'uid': os.getuid(), 'leaked': leaked}\n"
    )
    answer = target.stub.ExecuteTask(
        pb.ExecuteTaskRequest(
            run=pb.RunRef(
                run_uid="9d8c7b6a-5f4e-4d3c-8b2a-190807060504",
                attempt=1,
                namespace="default",
                name="t",
                runtime="python",
            ),
            config=pb.FunctionConfig(adapter="python", handler="main:run", inline=_inline("main.py", code)),
            input=b"null",
        ),
        timeout=60,
    )
    assert answer.status == pb.TASK_STATUS_SUCCEEDED, answer.error
    seen = json.loads(answer.outputs_json)
    assert seen["uid"] != 0 and not seen["leaked"]


def test_tmp_and_dev_shm_are_the_functions_own(attacker: Function, target: HostUnderAttack) -> None:
    planted = attacker.run(
        """
for directory in ("/tmp", "/dev/shm"):
    with open(directory + "/planted", "w") as f:
        f.write("from the attacker")
result = sorted(os.listdir("/tmp")) + sorted(os.listdir("/dev/shm"))
"""
    )
    assert planted.count("planted") == 2
    other = target.register(ATTACKER)
    try:
        seen = other.run('result = [os.path.exists(d + "/planted") for d in ("/tmp", "/dev/shm")]')
        assert seen == [False, False], "another function's /tmp and /dev/shm are its own"
    finally:
        target.stub.UnregisterFunction(
            pb.UnregisterFunctionRequest(registration_id=other.registration_id, grace_ms=100), timeout=30
        )


def test_in_network_none_proc_net_shows_no_socket_of_the_machine(
    attacker: Function, target: HostUnderAttack
) -> None:
    port = target.listener.getsockname()[1]
    assert f":{port:04X} " in Path("/proc/net/tcp").read_text(), "the host's own view lists the listener"
    seen = attacker.run("result = open('/proc/net/tcp').read() + open('/proc/net/unix').read()")
    assert f":{port:04X} " not in seen, "the function's network namespace holds only its own sockets"


@pytest.fixture
def world_writable() -> Iterator[Path]:
    """A directory anyone may write on the host's own file system, outside /tmp (every function
    has a /tmp of its own): in /var/tmp where there is one, else at the root."""
    parent = Path("/var/tmp") if Path("/var/tmp").is_dir() else Path("/")
    made = parent / f"krt-world-writable-{uuid.uuid4().hex[:8]}"
    made.mkdir()
    made.chmod(0o1777)
    try:
        yield made
    finally:
        shutil.rmtree(made)


def test_a_function_writes_nowhere_on_the_host_but_its_workspace_tmp_and_dev_shm(
    attacker: Function, world_writable: Path
) -> None:
    # Permissions would let any uid write there: what the next holder of the uid would find,
    # what another tenant's function would read, what would fill the host's disk.
    host_paths = [str(world_writable / "left"), "/var/tmp/krt-left-by-a-function", "/run/lock/krt-left"]
    own = [str(attacker.workdir / "mine"), "/tmp/mine", "/dev/shm/mine"]
    seen = attacker.run(probes.write(host_paths + own))
    assert seen[str(world_writable / "left")] == "EROFS", seen
    assert all(seen[path] != "written" for path in host_paths), seen
    assert not any(os.path.lexists(path) for path in host_paths), "nothing reached the host"
    assert all(seen[path] == "written" for path in own), seen
    assert (attacker.workdir / "mine").read_text() == "left by a function", "its workspace is the real one"


def _shm_keys(table: str) -> set[int]:
    """The keys of a /proc/sysvipc/shm listing."""
    return {int(line.split()[0]) for line in table.splitlines()[1:] if line.strip()}


def test_system_v_shared_memory_is_the_functions_own(attacker: Function, target: HostUnderAttack) -> None:
    key = 0x6B7274  # what a second tenant's function would look the segment up by
    made = attacker.run(probes.shm(key, create=True))
    assert made[0] >= 0 and key in made[1], "the function made its segment"
    assert key not in _shm_keys(Path("/proc/sysvipc/shm").read_text()), "the host's IPC is not its"
    other = target.register(ATTACKER)
    try:
        found = other.run(probes.shm(key, create=False))
        assert found[0] == -1 and key not in found[1], "another function cannot attach it"
    finally:
        target.stub.UnregisterFunction(
            pb.UnregisterFunctionRequest(registration_id=other.registration_id, grace_ms=100), timeout=30
        )


def test_the_kernel_surface_a_function_does_not_need_is_filtered(attacker: Function) -> None:
    resolve = seccomp._library().seccomp_syscall_resolve_name  # this machine's numbers
    calls = ("unshare", "clone3", "keyctl", "io_uring_setup", "bpf", "userfaultfd")
    numbers = {name: resolve(name.encode()) for name in calls}
    seen = attacker.run(
        f"NR = {numbers!r}\n"
        + """
import ctypes, errno, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
def call(*args):
    result = libc.syscall(*args)
    return "ok" if result >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
done = []
thread = threading.Thread(target=lambda: done.append(1))
thread.start()
thread.join()
result = {
    "seccomp": [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")][0],
    # a user namespace: every capability inside it, and the kernel code behind them
    "userns": call(NR["unshare"], 0x10000000),
    "clone3": call(NR["clone3"], 0, 0),
    "keyring": call(NR["keyctl"], 0, ctypes.c_long(-3), 0),  # KEYCTL_GET_KEYRING_ID, session
    "io_uring": call(NR["io_uring_setup"], 8, 0),
    "bpf": call(NR["bpf"], 0, 0, 0),
    "userfaultfd": call(NR["userfaultfd"], 0),
    # what functions do is not touched: threads, processes, fork
    "thread": done,
    "process": subprocess.run(["/bin/sh", "-c", "echo started"], capture_output=True, text=True).stdout,
    "fork": os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) if (pid := os.fork()) else os._exit(7),
}
"""
    )
    assert seen["seccomp"] == "2", "a filter is in force"
    assert seen["userns"] == "EPERM" and seen["keyring"] == "EPERM", seen
    assert seen["bpf"] == "EPERM" and seen["userfaultfd"] == "EPERM", seen
    assert seen["clone3"] == "ENOSYS" and seen["io_uring"] == "ENOSYS", seen
    assert seen["thread"] == [1] and seen["process"] == "started\n" and seen["fork"] == 7, seen


def test_in_network_none_no_unix_socket_of_the_host_is_reachable(
    attacker: Function, world_writable: Path
) -> None:
    # A socket with a path is not scoped by the network namespace, and a read-only mount does
    # not stop a connect: one anyone may connect to (a database's, the system bus) is a way out.
    path = world_writable / "open.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        path.chmod(0o777)
        listener.listen()
        listener.settimeout(0.2)
        seen = attacker.run(
            f"""
import errno, socket
try:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect({str(path)!r})
        reached = "connected"
except OSError as exc:
    reached = errno.errorcode.get(exc.errno, str(exc.errno))
a, b = socket.socketpair()
a.sendall(b"own")
result = [reached, b.recv(3).decode()]
"""
        )
        with contextlib.suppress(TimeoutError):
            listener.accept()[0].close()
            seen.append("accepted")
    assert seen == ["EPERM", "own"], "no connection; its own socketpair still works"


def test_the_machines_own_secrets_are_out_of_reach(target: HostUnderAttack) -> None:
    # A host pod whose template mounts a service account token, a host in a container with
    # Docker secrets: files any uid may read, there for the host's own processes.
    made = not Path("/run/secrets").exists()
    secret = Path("/run/secrets") / f"krt-test-{uuid.uuid4().hex[:8]}"
    secret.parent.mkdir(exist_ok=True)
    secret.write_text("machine-secret")
    secret.chmod(0o444)
    try:
        other = target.register(ATTACKER)
        try:
            seen = _read(other, [str(secret), f"/var/run/secrets/{secret.name}"])
        finally:
            target.stub.UnregisterFunction(
                pb.UnregisterFunctionRequest(registration_id=other.registration_id, grace_ms=100), timeout=30
            )
        assert all(value in ("FileNotFoundError", "PermissionError") for value in seen.values()), seen
        with pytest.raises(grpc.RpcError, match="secrets"):
            target.stub.RegisterFunction(
                target.registration(
                    pb.FunctionConfig(adapter="python", handler="main:handle", source_path=str(secret.parent))
                ),
                timeout=30,
            )
    finally:
        secret.unlink()
        if made:
            secret.parent.rmdir()
