"""Lanes (runtime/lanes.py): the calls of a krm function run one at a time in a call launcher
inside the function's sandbox. Each call still gets everything a directly started process got
(its uid, no capabilities, no_new_privs, its limits, a session of its own), nothing of a call
outlives it, a timeout ends the call's every process, the launchers end with their
registration and with the host, and a call that attacks its launcher harms only itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.runtime import lanes as runtime_lanes
from kruntimes.runtime.lanes import LANE_IDLE_S, Lane, Lanes, _cpu_share
from kruntimes.runtime.limits import ProcessLimits
from kruntimes.runtime.registry import Registration
from kruntimes.runtime.sandbox.child import SandboxSpec
from kruntimes.runtime.sandbox.identity import processes_of
from kruntimes.runtime.spawner import Exit, SpawnSpec
from kruntimes.wire import krm as contract
from tests.runtime.conftest import FILE_LIMIT, Host, inline, krm_serving, register_krm
from tests.support.gated import HOLDER
from tests.support.isolation import require_or_skip
from tests.support.locks import lock_free
from tests.support.pki import TestPKI
from tests.support.procs import alive
from tests.support.waiting import wait_until

# What the call's process is: its ids, session, capabilities and limits.
WHO = """
import json, os, resource, sys
sys.stdin.read()
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
print(json.dumps({
    "uid": os.getuid(), "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0),
    "pgid": os.getpgid(0), "capeff": int(status["CapEff"], 16), "nnp": int(status["NoNewPrivs"]),
    "fsize": resource.getrlimit(resource.RLIMIT_FSIZE)[0], "policy": os.sched_getscheduler(0),
}))
"""

# What the call finds in its scratch directories, then leaves something in each.
SCRATCH = """
import json, os, sys
sys.stdin.read()
print(json.dumps(sorted(os.listdir("/tmp")) + sorted(os.listdir("/dev/shm"))))
open("/tmp/left", "w").close()
os.mkdir("/dev/shm/dir")
open("/dev/shm/dir/file", "w").close()
"""

# Leaves a grandchild in a session of its own that ignores SIGTERM and holds a lock on the
# file its input names (and the call's stdout), and answers once that one holds it.
LEFTOVER = """
import fcntl, os, signal, sys, time
name = sys.stdin.read().strip()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        lock = open(name, "a")
        fcntl.flock(lock, fcntl.LOCK_EX)
        open(name + ".started", "w").close()
        time.sleep(60)
    os._exit(0)
while not os.path.exists(name + ".started"):
    time.sleep(0.01)
sys.stdout.write("left")
"""


# Does to its launcher (its parent) what its input says, then echoes "done".
ATTACK = """
import ctypes, os, signal, sys, time
what = sys.stdin.read().strip()
launcher = os.getppid()
if what == "kill":
    os.kill(launcher, signal.SIGKILL)
    time.sleep(5)
elif what == "stop":
    os.kill(launcher, signal.SIGSTOP)
elif what == "signals":
    for sig in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGPIPE",
                "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGXCPU", "SIGVTALRM", "SIGPROF", "SIGIO"):
        os.kill(launcher, getattr(signal, sig))
    time.sleep(0.2)
elif what == "lower":  # what the next call would inherit from its launcher
    import resource
    resource.prlimit(launcher, resource.RLIMIT_NOFILE, (64, 64))
    os.setpriority(os.PRIO_PROCESS, launcher, 19)
elif what == "ptrace":
    libc = ctypes.CDLL(None, use_errno=True)
    attached = libc.ptrace(16, launcher, None, None)  # PTRACE_ATTACH
    errors = [ctypes.get_errno() if attached != 0 else 0]
    try:
        open(f"/proc/{launcher}/mem", "rb").read(1)
        errors.append(0)
    except OSError as e:
        errors.append(e.errno)
    sys.stdout.write(" ".join(map(str, errors)) + " ")
sys.stdout.write("done")
"""


@pytest.fixture(scope="module")
def lane_host(tmp_path_factory: pytest.TempPathFactory, pki: TestPKI, shared: Path) -> Iterator[Host]:
    with krm_serving(tmp_path_factory, pki, shared, host_id="lanes-0", krm_concurrency=2) as served:
        in_force = served.runtime.in_force
        if in_force is None or not in_force.pid_namespace:
            require_or_skip("this host makes no PID namespaces: each call is started by the zygote")
        yield served


# An environment that sets a PYTHON* variable: the interpreter reads it at its start, so the
# lane starts each call with posix_spawn instead of forking its Python lane.
SPAWNED = {"PYTHONDONTWRITEBYTECODE": "1"}
MODES = pytest.mark.parametrize("env", [{}, SPAWNED], ids=["forked", "spawned"])


def call(host: Host, reg: str, text: str = "", *, timeout_ms: int = 60_000) -> pb.InvokeFunctionResponse:
    return host.invoke(reg, contract.encode_request(text.encode()), timeout_ms=timeout_ms)


def answer(host: Host, reg: str, text: str = "", *, timeout_ms: int = 60_000) -> tuple[int, bytes]:
    """(exit code, stdout) of one call that the host answered."""
    got = call(host, reg, text, timeout_ms=timeout_ms)
    assert got.status == pb.INVOCATION_STATUS_SUCCEEDED, got
    exit_code, stdout, _written = contract.decode_outputs(json.loads(got.outputs_json))
    return exit_code, stdout or b""


def registration(host: Host, reg: str) -> Registration:
    found = host.runtime.registry.get(reg)
    assert found is not None
    return found


def lanes_of(host: Host, reg: str) -> Lanes:
    lanes = registration(host, reg).lanes
    assert lanes is not None, "a krm function with a PID namespace runs its calls in lanes"
    return lanes


def launchers(host: Host, reg: str) -> set[int]:
    """The processes of the function's uid (between calls: its launchers alone)."""
    lease = registration(host, reg).lease
    assert lease is not None and lease.uid is not None
    return set(processes_of(lease.uid))


def test_each_call_runs_as_a_direct_start_would_and_calls_share_one_launcher(lane_host: Host) -> None:
    reg = register_krm(lane_host, WHO)
    first, second = (json.loads(answer(lane_host, reg)[1]) for _ in range(2))
    for who in (first, second):
        assert who["uid"] != 0 and who["capeff"] == 0 and who["nnp"] == 1
        assert who["sid"] == who["pid"] == who["pgid"], "each call leads a session of its own"
        assert who["fsize"] == FILE_LIMIT, "the host's limits hold for each call"
        assert who["policy"] == os.SCHED_BATCH, "as every function process (runtime/zygote.py)"
    assert first["uid"] == second["uid"] and first["ppid"] == second["ppid"], "one launcher served both"
    assert first["pid"] != second["pid"]
    assert lanes_of(lane_host, reg).count() == 1


@MODES
def test_each_call_finds_empty_scratch_directories(lane_host: Host, env: dict[str, str]) -> None:
    reg = register_krm(lane_host, SCRATCH, env)
    first, second = (json.loads(answer(lane_host, reg)[1]) for _ in range(2))
    assert first == second, "what the first call left is gone; what the view put there stays"
    assert not {"left", "dir"} & set(second)
    assert lanes_of(lane_host, reg).count() == 1


@MODES
def test_what_a_call_leaves_running_is_gone_before_its_answer(
    lane_host: Host, scratch: Path, env: dict[str, str]
) -> None:
    reg = register_krm(lane_host, LEFTOVER, env)
    lock = scratch / "leftover"
    assert answer(lane_host, reg, str(lock)) == (0, b"left")
    assert lock_free(lock), "the double-forked grandchild ignoring SIGTERM is gone when the call answers"
    again = scratch / "again"
    assert answer(lane_host, reg, str(again)) == (0, b"left"), "the lane takes the next call"
    assert lock_free(again)
    assert lanes_of(lane_host, reg).count() == 1
    assert lanes_of(lane_host, reg).forked == (0 if env else 2)


def test_a_timeout_ends_every_process_of_the_call_and_the_next_call_gets_a_new_lane(
    lane_host: Host, scratch: Path
) -> None:
    reg = register_krm(lane_host, HOLDER)
    lock = scratch / "holder"
    got = call(lane_host, reg, str(lock), timeout_ms=1500)
    assert got.status == pb.INVOCATION_STATUS_TIMED_OUT, got
    assert (scratch / "holder.started").exists()
    assert wait_until(lambda: lock_free(lock)), "the call and its child are gone"
    follow = scratch / "follow"
    got = call(lane_host, reg, str(follow), timeout_ms=1500)
    assert got.status == pb.INVOCATION_STATUS_TIMED_OUT, "a new lane took it"
    assert wait_until(lambda: lock_free(follow))


def test_launchers_end_when_idle_and_with_their_registration(lane_host: Host) -> None:
    reg = register_krm(lane_host, WHO)
    answer(lane_host, reg)
    lanes = lanes_of(lane_host, reg)
    idle = launchers(lane_host, reg)
    assert len(idle) == 1, "between calls the launcher is the function's only process"
    lanes.sweep(time.monotonic() + LANE_IDLE_S)
    assert lanes.count() == 0 and wait_until(lambda: not any(alive(p) for p in idle))
    answer(lane_host, reg)
    running = launchers(lane_host, reg)
    assert len(running) == 1 and lanes.count() == 1
    lane_host.stub.UnregisterFunction(pb.UnregisterFunctionRequest(registration_id=reg))
    assert wait_until(lambda: not any(alive(p) for p in running)), "the launcher ends with the lease"


@pytest.mark.parametrize("attack", ["kill", "stop"])
def test_a_call_that_kills_or_stops_its_launcher_fails_alone(lane_host: Host, attack: str) -> None:
    reg = register_krm(lane_host, ATTACK)
    assert answer(lane_host, reg, "nothing") == (0, b"done")
    got = call(lane_host, reg, attack, timeout_ms=3000)
    if attack == "kill":  # ended with its namespace, as a process killed by SIGKILL
        assert got.status == pb.INVOCATION_STATUS_SUCCEEDED, got
        assert contract.decode_outputs(json.loads(got.outputs_json))[0] == 137
    else:  # its end is never reported
        assert got.status == pb.INVOCATION_STATUS_TIMED_OUT, got
    assert answer(lane_host, reg, "nothing") == (0, b"done"), "the next call gets a new lane"
    assert lanes_of(lane_host, reg).count() == 1


def test_a_call_cannot_signal_away_or_trace_its_launcher(lane_host: Host) -> None:
    reg = register_krm(lane_host, ATTACK)
    assert answer(lane_host, reg, "nothing") == (0, b"done")
    before = launchers(lane_host, reg)
    assert answer(lane_host, reg, "signals") == (0, b"done")
    code, out = answer(lane_host, reg, "ptrace")
    attach_errno, mem_errno, done = out.decode().split()
    assert code == 0 and done == "done"
    assert int(attach_errno) != 0 and int(mem_errno) != 0, "the launcher is not dumpable"
    assert launchers(lane_host, reg) == before, "the same launcher took every call"


def test_the_launchers_die_when_the_host_is_killed(tmp_path: Path, pki: TestPKI) -> None:
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kruntimes.workers.host", "--host-id", "lanes-1", "--runtime", "krm"]
        + [
            "--state-dir",
            str(tmp_path / "state"),
            "--ready-file",
            str(ready),
            *pki.host_args("lanes-1", "krm"),
        ],
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_until(ready.exists, within=30), "host never wrote its ready file"
        info = json.loads(ready.read_text())
        run = pb.RunRef(run_uid=str(uuid.uuid4()), attempt=1, namespace="default", name="who", runtime="krm")
        signed = pki.sign(
            run_uid=run.run_uid,
            attempt=1,
            host_id="lanes-1",
            host_uid=info["hostUid"],
            name="who",
            runtime="krm",
        )
        config = pb.FunctionConfig(
            adapter="krm", handler=f"{sys.executable} main.py", inline=inline({"main.py": WHO})
        )
        with pki.channel(info["address"], as_=pki.control_plane) as channel:
            reg = pb_grpc.FunctionRuntimeStub(channel).RegisterFunction(
                pb.RegisterFunctionRequest(run=run, config=config, assignment=signed), timeout=30
            )
        with pki.channel(info["address"], as_=pki.gateway) as channel:
            got = pb_grpc.FunctionRuntimeStub(channel).InvokeFunction(
                pb.InvokeFunctionRequest(
                    registration_id=reg.registration_id, payload=contract.encode_request(b"")
                ),
                timeout=30,
            )
        who = json.loads(contract.decode_outputs(json.loads(got.outputs_json))[1] or b"{}")
        if who["ppid"] != 2:
            require_or_skip("this host makes no PID namespaces: no launcher")
        assert wait_until(lambda: len(processes_of(who["uid"])) == 1), "its launcher waits for calls"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert wait_until(lambda: processes_of(who["uid"]) == []), "the launcher must not outlive the host"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# What the interpreter is for the call, then state left behind in it every way a script can.
FRESH = """
import atexit, builtins, json, os, sys, threading, time
sys.stdin.read()
print(json.dumps({
    "name": __name__, "file": __file__, "argv": sys.argv, "path0": sys.path[0],
    "leaks": [hasattr(json, "leak"), "LEAK" in os.environ, hasattr(builtins, "leak"),
              "leak" in globals(), "leaked" in sys.modules, threading.active_count()],
    "launcher": sorted(m for m in sys.modules if m.startswith(("kruntimes", "runtime"))),
}))
json.leak = builtins.leak = leak = 1
os.environ["LEAK"] = "1"
sys.modules["leaked"] = json
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
atexit.register(lambda: sys.stdout.write("at exit"))
"""

# Ends as its input says.
ENDS = """
import sys
how = sys.stdin.read().strip()
sys.stdout.write("out ")
if how == "exit":
    sys.exit(3)
if how == "raise":
    raise ValueError("raised")
if how == "interrupt":
    raise KeyboardInterrupt
"""


def test_a_python_entrypoints_calls_are_forks_of_its_lane_that_start_as_a_fresh_interpreter(
    lane_host: Host,
) -> None:
    reg = register_krm(lane_host, FRESH)
    first, second = (answer(lane_host, reg) for _ in range(2))
    assert first[0] == second[0] == 0
    assert first[1].endswith(b"at exit") and second[1].endswith(b"at exit"), "atexit ran at its end"
    seen = [json.loads(out[: -len(b"at exit")]) for _, out in (first, second)]
    for who in seen:
        assert who["name"] == "__main__" and who["argv"] == ["main.py"]
        assert who["file"].endswith("/main.py") and who["path0"] == os.path.dirname(who["file"])
        assert who["launcher"] == [], "nothing of the launcher is left in sys.modules"
    assert seen[0]["leaks"] == seen[1]["leaks"] == [False, False, False, False, False, 1], (
        "nothing the first call left in its interpreter is in the second's"
    )
    lanes = lanes_of(lane_host, reg)
    assert lanes.forked == 2 and lanes.count() == 1


@pytest.mark.parametrize(
    ("how", "code", "error"),
    [("", 0, b""), ("exit", 3, b""), ("raise", 1, b"ValueError: raised"), ("interrupt", 130, b"")],
)
@MODES
def test_a_python_call_ends_with_the_interpreters_exit_code(
    lane_host: Host, env: dict[str, str], how: str, code: int, error: bytes
) -> None:
    reg = register_krm(lane_host, ENDS, env)
    got = call(lane_host, reg, how)
    assert got.status == pb.INVOCATION_STATUS_SUCCEEDED, got
    exit_code, stdout, _ = contract.decode_outputs(json.loads(got.outputs_json))
    assert (exit_code, stdout) == (code, b"out "), "its exit code, its stdout flushed"
    assert error in got.stderr.data
    if how == "raise":
        assert b'main.py", line 8, in <module>' in got.stderr.data
        assert b"launcher" not in got.stderr.data, "the traceback starts at the script"
    assert lanes_of(lane_host, reg).forked == (0 if env else 1)


def test_a_call_that_lowers_what_its_launcher_passes_on_ends_its_lane(lane_host: Host) -> None:
    reg = register_krm(lane_host, ATTACK)
    assert answer(lane_host, reg, "nothing") == (0, b"done")
    before = launchers(lane_host, reg)
    assert answer(lane_host, reg, "lower") == (0, b"done")
    assert answer(lane_host, reg, "nothing") == (0, b"done")
    assert launchers(lane_host, reg).isdisjoint(before), "a new lane took the next call"
    reg_who = register_krm(lane_host, WHO)
    who = json.loads(answer(lane_host, reg_who)[1])
    assert who["fsize"] == FILE_LIMIT


class _Zygote:
    """Stands in for the spawner: each spawn a new pid, which ends when killed."""

    def __init__(self) -> None:
        self.spawned: list[int] = []
        self.killed: list[int] = []
        self.exits: dict[int, Exit] = {}

    def spawn(self, spec: SpawnSpec, fds: list[int]) -> tuple[int, Exit]:
        assert spec.kind == "launcher" and len(fds) == 4
        self.spawned.append(1000 + len(self.spawned))
        self.exits[self.spawned[-1]] = Exit()
        return self.spawned[-1], self.exits[self.spawned[-1]]

    def kill(self, pid: int) -> None:
        self.killed.append(pid)
        self.exits[pid].set(-9)


def fake_lanes(zygote: _Zygote) -> Lanes:
    """Lanes of a krm function whose spawner is `zygote`."""
    spec = SpawnSpec(
        kind="exec",
        cwd="/",
        env={},
        limits=ProcessLimits(),
        argv=("/bin/true",),
        sandbox=SandboxSpec(pid_namespace=True, mount_namespace=True),
    )
    return Lanes(zygote, spec)  # type: ignore[arg-type]


def test_one_lane_is_started_at_a_time_and_a_waiting_call_takes_the_first_free() -> None:
    zygote = _Zygote()
    lanes = fake_lanes(zygote)
    first = lanes._take(time.monotonic() + 5)
    with pytest.raises(TimeoutError):  # the first has not started its call: no second start
        lanes._take(time.monotonic() + 0.2)
    assert zygote.spawned == [first.pid]
    taken: list[object] = []
    waiter = threading.Thread(target=lambda: taken.append(lanes._take(time.monotonic() + 30)))
    waiter.start()
    lanes._give_back(first)  # the first call ended before its lane's start was proven
    waiter.join(30)
    assert taken == [first] and zygote.spawned == [first.pid], "the waiting call took the free lane"
    lanes._started(first)
    second = lanes._take(time.monotonic() + 5)  # none free, none starting: a new one
    assert second is not first and len(zygote.spawned) == 2
    lanes.close()
    assert set(zygote.killed) == {first.pid, second.pid}


def test_a_lane_started_ahead_counts_as_starting_until_it_started_a_call() -> None:
    zygote = _Zygote()
    lanes = fake_lanes(zygote)
    lanes.prestart()
    ahead = lanes._take(time.monotonic() + 5)
    assert zygote.spawned == [ahead.pid], "the call took the lane started ahead"
    with pytest.raises(TimeoutError):  # it has not started that call yet: no second start
        lanes._take(time.monotonic() + 0.2)
    lanes._started(ahead)
    second = lanes._take(time.monotonic() + 5)
    assert second is not ahead and len(zygote.spawned) == 2
    lanes._started(second)
    lanes.close()
    again = fake_lanes(zygote)
    again.prestart()
    again.sweep(time.monotonic() + LANE_IDLE_S)  # ended idle, before any call
    third = again._take(time.monotonic() + 5)
    assert third.pid == zygote.spawned[-1] and len(zygote.spawned) == 4, "a new one is started"
    again.close()


def _one_busy(*, cpus: int | None = None) -> tuple[_Zygote, Lanes, Lane]:
    """Lanes of a stand-in zygote (on `cpus` CPUs, if given) with one lane started and taken."""
    zygote = _Zygote()
    lanes = fake_lanes(zygote)
    if cpus is not None:
        lanes._cpus = cpus
    busy = lanes._take(time.monotonic() + 5)
    lanes._started(busy)
    return zygote, lanes, busy


def _waits_then_starts(zygote: _Zygote, lanes: Lanes, busy: Lane, **known: float) -> None:
    """A call finds the one lane `busy` taken and waits rather than start another, until what
    the lanes know of their calls becomes `known`: then it gets a second lane."""
    with pytest.raises(TimeoutError):
        lanes._take(time.monotonic() + 0.2)
    assert zygote.spawned == [busy.pid]
    for name, value in known.items():
        setattr(lanes, name, value)
    other = lanes._take(time.monotonic() + 5)
    assert other is not busy and len(zygote.spawned) == 2
    lanes._started(other)
    lanes.close()


def test_a_call_waits_for_a_busy_lane_when_its_calls_end_sooner_than_a_lane_starts() -> None:
    zygote, lanes, busy = _one_busy()
    lanes._start_s, lanes._call_s = 1.0, 0.01  # as measured: starts take 1 s, calls 10 ms
    # waiting for the busy one beats starting one, until calls outlast a start
    _waits_then_starts(zygote, lanes, busy, _call_s=2.0)


def test_no_lane_past_the_cpus_for_calls_that_keep_a_cpu_busy() -> None:
    zygote, lanes, busy = _one_busy(cpus=1)
    lanes._start_s, lanes._call_s = 0.01, 1.0  # calls that outlast a start many times
    lanes._cpu_share = 0.9  # and spend 90% of it on a CPU: a second lane ends none sooner
    # calls that mostly wait: another lane serves the waiting sooner
    _waits_then_starts(zygote, lanes, busy, _cpu_share=0.1)


def test_before_any_call_ended_a_lane_per_cpu_and_more_only_once_a_call_outran_a_start() -> None:
    zygote = _Zygote()
    lanes = fake_lanes(zygote)
    lanes._cpus = 2
    first = lanes._take(time.monotonic() + 5)
    lanes._started(first)
    second = lanes._take(time.monotonic() + 5)  # nothing known of the calls: a lane per CPU
    assert second is not first and len(zygote.spawned) == 2
    lanes._started(second)
    lanes._start_s = 10.0  # a lane takes 10 s to start
    first.taken = second.taken = time.monotonic()  # their calls have just begun
    with pytest.raises(TimeoutError):
        lanes._take(time.monotonic() + 0.2)
    assert len(zygote.spawned) == 2
    first.taken -= 20.0  # one has run for longer than a lane takes to start
    third = lanes._take(time.monotonic() + 5)
    assert third not in (first, second) and len(zygote.spawned) == 3
    lanes._started(third)
    lanes.close()


def test_a_calls_cpu_share_leaves_out_what_it_waited_for_a_cpu() -> None:
    assert _cpu_share({"cpu": 0.01, "wall": 0.05, "delay": 0.04}) == pytest.approx(1.0)
    assert _cpu_share({"cpu": 0.01, "wall": 0.05, "delay": 0.0}) == pytest.approx(0.2)
    assert _cpu_share({"cpu": 0.02, "wall": 0.05, "delay": 0.04}) == 1.0, "never above one"
    assert _cpu_share({"code": 0, "clean": True}) is None, "a launcher that does not say"


# Burns the CPU time its input names (its own, whatever else runs), or sleeps that long.
BURNS = """
import sys, time
how, seconds = sys.stdin.read().split()
if how == "burn":
    end = time.process_time() + float(seconds)
    while time.process_time() < end:
        pass
else:
    time.sleep(float(seconds))
sys.stdout.write(how)
"""


@MODES
def test_the_launcher_says_how_much_cpu_each_call_used_and_for_how_long_it_ran(
    lane_host: Host, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    reports: list[dict[str, float]] = []

    def seen(report: dict[str, float]) -> float | None:
        reports.append(report)
        return _cpu_share(report)

    monkeypatch.setattr(runtime_lanes, "_cpu_share", seen)
    reg = register_krm(lane_host, BURNS, env)
    assert answer(lane_host, reg, "burn 0.2") == (0, b"burn")
    assert answer(lane_host, reg, "sleep 0.2") == (0, b"sleep")
    burned, slept = reports
    assert burned["cpu"] >= 0.2 and burned["wall"] >= burned["cpu"], "its own CPU time, at least"
    assert slept["wall"] >= 0.2 > slept["cpu"], "a sleep is time, not CPU"
    for report in (burned, slept):
        assert 0 <= report["delay"] <= report["wall"]
