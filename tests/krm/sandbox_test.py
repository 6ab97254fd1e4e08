"""The exec evaluator's binaries run in the function sandbox (runtime/binaries.py through
workers/fn_sandbox.py), as `krt fn-runner` and `krt fn eval --exec` run them as root: a uid of
their own, their own PID namespace, no network, the platform's state directory hidden, a fresh
working directory for every evaluation, nothing of an evaluation left running after it, and a
deadline or a cancellation that kills the function at once.

Each probe is a real function process asked about its world by a real evaluation; the network
probe dials a real listener of this test."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from kruntimes.krm import errors, process
from kruntimes.krm.client import RemoteEvaluator
from kruntimes.krm.evaluation import Request
from kruntimes.krm.executable import ExecEvaluator
from kruntimes.krm.resources import dump, resource_list
from kruntimes.runtime.binaries import SandboxedBinaries
from kruntimes.runtime.sandbox.policy import Network, SandboxSettings
from kruntimes.workers.fn_sandbox import SandboxRunner
from tests.krm import programs
from tests.krm.conftest import eventually, function_config, items, store_with
from tests.krm.runner_process import fn_runner
from tests.support.isolation import needing

isolation_needed = needing(
    os.geteuid() == 0, "switching uids needs root (not root, `krt fn eval` says it runs unsandboxed)"
)

# Tells what it can see and do on stderr (JSON), leaves a file in its working directory and a
# process behind it, and answers its input.
PROBE = """
import json, os, socket, subprocess, sys
data = sys.stdin.read()
facts = {{"uid": os.getuid(), "cwd": os.getcwd(), "entries": sorted(os.listdir(".")),
          "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}}
try:
    open({secret!r}).read()
    facts["secret"] = "read"
except OSError as e:
    facts["secret"] = type(e).__name__
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
    facts["net"] = "connected"
except OSError as e:
    facts["net"] = type(e).__name__
try:
    os.kill({runner}, 0)
    facts["runner"] = "signalable"
except OSError as e:
    facts["runner"] = type(e).__name__
open("left-behind", "w").write("x")
subprocess.Popen(["/bin/sh", "-c", "sleep 300", {token!r}], start_new_session=True)
sys.stderr.write(json.dumps(facts))
sys.stdout.write(data)
"""


def _with_token(token: str) -> list[int]:
    """This machine's processes whose command line holds `token`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if token.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
    return found


@pytest.fixture
def listener() -> Iterator[tuple[socket.socket, int]]:
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    try:
        yield server, server.getsockname()[1]
    finally:
        server.close()


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    path = state / "client.json"
    path.write_text('{"token": "not for functions"}')
    path.chmod(0o644)
    return path


@pytest.fixture
async def sandboxed(secret: Path) -> AsyncIterator[SandboxRunner]:
    binaries = SandboxedBinaries(SandboxSettings(network=Network.NONE), hide=(str(secret.parent),))
    binaries.start()
    runner = SandboxRunner(binaries, max_parallel=4)
    try:
        yield runner
    finally:
        runner.close()


def _request(image: str, *, timeout: float = 30.0) -> Request:
    return Request.new(image=image, resource_list=resource_list(items()), timeout=timeout)


async def test_a_binary_runs_as_its_own_user_in_its_own_namespaces(
    sandboxed: SandboxRunner, functions: Path, secret: Path, listener: tuple[socket.socket, int]
) -> None:
    server, port = listener
    token = f"krt-probe-{uuid.uuid4().hex}"
    programs.write(
        functions, "probe", PROBE, secret=str(secret), port=str(port), runner=str(os.getpid()), token=token
    )
    evaluator = ExecEvaluator(store_with(functions, "probe"), runner=sandboxed)
    first = await evaluator.evaluate(_request("example.com/fn/probe:v1.0.0"))
    facts = json.loads(first.log)
    assert facts["uid"] not in (0, os.getuid()), "a uid of its own, not the runner's"
    assert facts["secret"] == "FileNotFoundError", "the state directory is hidden"
    assert facts["net"] != "connected", "no network"
    with pytest.raises(BlockingIOError):
        server.accept()  # nothing reached this test's listener
    assert facts["runner"] == "ProcessLookupError", "the runner is not in its PID namespace"
    assert len(facts["pids"]) <= 5, facts["pids"]
    # its working directory is its private /tmp, which holds nothing but the way to the paths its
    # view shows (its binary's directory); the next evaluation finds it as the first did
    assert facts["cwd"] == "/tmp" and "left-behind" not in facts["entries"]
    second = json.loads((await evaluator.evaluate(_request("example.com/fn/probe:v1.0.0"))).log)
    assert second["entries"] == facts["entries"], "nothing the first evaluation left"
    await eventually(lambda: not _with_token(token), timeout=10, what="the left-behind processes are gone")


async def test_two_binaries_have_two_identities(sandboxed: SandboxRunner, functions: Path) -> None:
    uid = "import os, sys\ndata = sys.stdin.read()\nsys.stderr.write(str(os.getuid()))\nsys.stdout.write(data)\n"
    programs.write(functions, "one", uid)
    programs.write(functions, "two", uid)
    evaluator = ExecEvaluator(store_with(functions, "one", "two"), runner=sandboxed)
    one = await evaluator.evaluate(_request("example.com/fn/one:v1.0.0"))
    two = await evaluator.evaluate(_request("example.com/fn/two:v1.0.0"))
    assert int(one.log) != int(two.log)
    assert sandboxed.binaries.count() == 2


async def test_a_deadline_kills_the_function_and_everything_it_started(
    sandboxed: SandboxRunner, functions: Path
) -> None:
    program = "stubborn"  # it ignores SIGTERM
    token = f"krt-deadline-{uuid.uuid4().hex}"
    body = (
        "import signal, subprocess, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"subprocess.Popen(['/bin/sh', '-c', 'sleep 300', {token!r}])\nsys.stdout.write('partial')\nsys.stdout.flush()\n"
        "time.sleep(300)\n"
    )
    programs.write(functions, program, body)
    evaluator = ExecEvaluator(store_with(functions, program), runner=sandboxed)
    with pytest.raises(errors.DeadlineExceeded):
        await evaluator.evaluate(_request(f"example.com/fn/{program}:v1.0.0", timeout=1.0))
    await eventually(lambda: not _with_token(token), timeout=10, what="nothing of it left")


async def test_a_cancelled_evaluation_kills_the_function_at_once(
    sandboxed: SandboxRunner, functions: Path
) -> None:
    token = f"krt-cancel-{uuid.uuid4().hex}"
    programs.write(
        functions,
        "sleeper",
        f"import subprocess, time\nsubprocess.Popen(['/bin/sh', '-c', 'sleep 300', {token!r}])\ntime.sleep(300)\n",
    )
    evaluator = ExecEvaluator(store_with(functions, "sleeper"), runner=sandboxed)
    task = asyncio.create_task(evaluator.evaluate(_request("example.com/fn/sleeper:v1.0.0", timeout=60)))
    await eventually(lambda: bool(_with_token(token)), timeout=10, what="the function runs")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: not _with_token(token), timeout=10, what="nothing of it left")


async def test_a_binary_that_cannot_start_is_a_system_error(
    sandboxed: SandboxRunner, functions: Path
) -> None:
    (functions / "not-executable").write_text("#!/bin/sh\ncat\n")
    evaluator = ExecEvaluator(store_with(functions, "not-executable"), runner=sandboxed)
    with pytest.raises(errors.SystemError_, match="not-executable"):
        await evaluator.evaluate(_request("example.com/fn/not-executable:v1.0.0"))


async def test_output_past_the_bound_is_refused_and_stops_the_function(
    sandboxed: SandboxRunner, functions: Path
) -> None:
    """A function that writes without end is stopped once it is past the bound, not at its
    deadline (which would be DeadlineExceeded), and nothing of it is left."""
    token = f"krt-flood-{uuid.uuid4().hex}"
    programs.write(
        functions,
        "flood",
        f"import subprocess, sys\nsubprocess.Popen(['/bin/sh', '-c', 'sleep 300', {token!r}])\n"
        "sys.stdin.read()\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
    )
    evaluator = ExecEvaluator(store_with(functions, "flood"), runner=sandboxed)
    with pytest.raises(errors.OutputTooLarge):
        await evaluator.evaluate(_request("example.com/fn/flood:v1.0.0", timeout=60))
    await eventually(lambda: not _with_token(token), timeout=10, what="nothing of it left")


def test_krt_fn_eval_exec_runs_the_binary_sandboxed(functions: Path, secret: Path, tmp_path: Path) -> None:
    programs.write(
        functions,
        "who",
        f"import os, sys\ndata = sys.stdin.read()\n"
        f"try:\n    open({str(secret)!r}).read()\n    seen = 'read'\nexcept OSError as e:\n    seen = type(e).__name__\n"
        "sys.stderr.write(f'uid={os.getuid()} secret={seen}')\nsys.exit(3)\n",
    )
    krt = Path(sys.executable).with_name("krt")
    done = subprocess.run(
        [str(krt), "fn", "eval", "-", "--exec", str(functions / "who")],
        input=json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KRT_STATE_DIR": str(secret.parent)},
        check=False,
    )
    assert done.returncode != 0, done.stderr
    assert "secret=FileNotFoundError" in done.stderr, done.stderr
    uid = int(done.stderr.split("uid=", 1)[1].split()[0])
    assert uid not in (0, os.getuid())


async def test_krt_fn_runner_runs_binaries_sandboxed(
    functions: Path, secret: Path, tmp_path: Path, listener: tuple[socket.socket, int]
) -> None:
    """The runner as a real process, asked over gRPC: its binaryExecutor function runs as another
    uid, without the network, the runner's state directory hidden from it."""
    server, port = listener
    token = f"krt-runner-{uuid.uuid4().hex}"
    async with fn_runner(tmp_path, functions, env={"KRT_STATE_DIR": str(secret.parent)}) as served:
        programs.write(
            functions, "probe", PROBE, secret=str(secret), port=str(port), runner=str(served.pid), token=token
        )
        config = function_config("probe", prefixes=["example.com/fn/probe"], path="probe", tags=["1.x"])
        (served.configs / "probe.yaml").write_text(dump(config))
        remote = RemoteEvaluator(served.address)
        try:

            async def known() -> bool:
                try:
                    await remote.evaluate(_request("example.com/fn/probe:v1.0.0"))
                except errors.NotFound:
                    return False
                return True

            await eventually(known, timeout=10, what="the FunctionConfig is served")
            facts = json.loads((await remote.evaluate(_request("example.com/fn/probe:v1.0.0"))).log)
        finally:
            await remote.close()
    assert facts["uid"] not in (0, os.getuid())
    assert facts["secret"] == "FileNotFoundError"
    assert facts["net"] != "connected"
    with pytest.raises(BlockingIOError):
        server.accept()
    assert facts["runner"] == "ProcessLookupError", "the runner is out of its reach"
    await eventually(lambda: not _with_token(token), timeout=10, what="the left-behind processes are gone")


def test_krt_fn_eval_network_is_asked_for(functions: Path, listener: tuple[socket.socket, int]) -> None:
    """`krt fn eval --exec` gives a binary no network; with --network it reaches this test's
    listener."""
    server, port = listener
    programs.write(
        functions,
        "dial",
        "import socket, sys\ndata = sys.stdin.read()\n"
        f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=5).close()\n    got = 'connected'\n"
        "except OSError as e:\n    got = type(e).__name__\nsys.stderr.write(got)\nsys.exit(3)\n",
    )
    krt = Path(sys.executable).with_name("krt")

    def dial(*flags: str) -> str:
        done = subprocess.run(
            [str(krt), "fn", "eval", "-", "--exec", str(functions / "dial"), *flags],
            input=json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return done.stderr

    without = dial()
    assert "connected" not in without, without
    with pytest.raises(BlockingIOError):
        server.accept()
    with_network = dial("--network")
    assert "stderr: connected" in with_network, with_network
    server.setblocking(True)
    server.settimeout(5)
    server.accept()[0].close()  # the connection it made


async def test_a_binary_in_a_hidden_directory_is_not_run(sandboxed: SandboxRunner, secret: Path) -> None:
    """Its own directory is shown to a binary: one in the state directory is refused, so that
    the directory stays hidden (a link to it from elsewhere is followed first)."""
    inside = programs.write(secret.parent, "fn", "import sys\nsys.stdout.write(sys.stdin.read())\n")
    link_dir = secret.parent.parent / "links"
    link_dir.mkdir()
    (link_dir / "fn").symlink_to(inside)
    evaluator = ExecEvaluator(store_with(secret.parent, "fn"), runner=sandboxed)
    for argv in ([str(inside)], [str(link_dir / "fn")]):
        with pytest.raises(errors.SystemError_, match="functions must not see"):
            await evaluator.run(argv, _request("example.com/fn/fn:v1.0.0"))
    assert sandboxed.binaries.count() == 0


async def test_concurrent_evaluations_each_get_their_own_answer(
    sandboxed: SandboxRunner, functions: Path
) -> None:
    """Twelve evaluations of one binary at once, four running at a time in its lanes: each gets
    back what it sent, and the binary holds one identity."""
    programs.write(
        functions,
        "echo-slow",
        "import sys, time\ndata = sys.stdin.read()\ntime.sleep(0.05)\nsys.stdout.write(data)\n",
    )
    evaluator = ExecEvaluator(store_with(functions, "echo-slow"), runner=sandboxed, max_parallel=4)
    sent = [
        resource_list([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i}"}}])
        for i in range(12)
    ]
    answers = await asyncio.gather(
        *(
            evaluator.evaluate(Request.new(image="example.com/fn/echo-slow:v1.0.0", resource_list=data))
            for data in sent
        )
    )
    assert [a.resource_list for a in answers] == sent
    assert sandboxed.binaries.count() == 1


async def test_the_evaluators_limits_hold_in_the_sandbox(sandboxed: SandboxRunner, functions: Path) -> None:
    """The evaluator's limits are the function's, and a binary under other limits gets lanes of
    its own: each evaluation sees the bound its evaluator set."""
    programs.write(
        functions,
        "nofile",
        "import resource, sys\ndata = sys.stdin.read()\n"
        "sys.stderr.write(str(resource.getrlimit(resource.RLIMIT_NOFILE)[0]))\nsys.stdout.write(data)\n",
    )
    store = store_with(functions, "nofile")
    for bound in (32, 64):
        evaluator = ExecEvaluator(store, runner=sandboxed, limits=process.Limits(open_files=bound))
        assert int((await evaluator.evaluate(_request("example.com/fn/nofile:v1.0.0"))).log) == bound
