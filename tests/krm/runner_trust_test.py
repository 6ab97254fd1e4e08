"""Who may evaluate on `krt fn-runner`: on a TCP port only callers presenting a platform identity
(mutual TLS), on a Unix socket only its owner; a plaintext TCP port is refused at start. Each
caller has its own share of evaluations: one past its bound gets ResourceExhausted while another
caller is served. The runner is a real process, its callers real gRPC clients and `krt fn eval`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import stat
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from kruntimes.krm import errors
from kruntimes.krm.client import EMBEDDED_TLS, RUNNER_ROLE, RemoteEvaluator
from kruntimes.krm.resources import dump, load_all
from kruntimes.pki import CA_CERT, Identity, PeerTLS
from kruntimes.rpc.v1 import krm_pb2 as pb
from kruntimes.rpc.v1 import krm_pb2_grpc as pb_grpc
from tests.krm import programs
from tests.krm.conftest import eventually, function_config, request
from tests.krm.runner_process import RunnerProcess, fn_runner
from tests.support.pki import TestPKI

RUNNER = Identity.host(runtime="krm", host_id="fn-runner")
NAP = "import sys, time\nsys.stdin.read()\ntime.sleep(60)\n"


def _serve(configs: Path, name: str, binary: str) -> None:
    config = function_config(name, prefixes=[f"example.com/fn/{name}"], path=binary, tags=["1.x"])
    (configs / f"{name}.yaml").write_text(dump(config))


async def _served(remote: RemoteEvaluator, image: str) -> None:
    async def known() -> bool:
        try:
            await remote.evaluate(request(image))
        except errors.NotFound:
            return False
        return True

    await eventually(known, timeout=15, what=f"{image} is served")


def _running(script: Path) -> int:
    """How many processes of this machine run `script` (its interpreter's argv[1])."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                count += len(argv) > 1 and argv[1] == str(script).encode()
    return count


def _python_for_others() -> str:
    """An interpreter another user may run (this one may lie in root's home)."""
    for candidate in (os.path.realpath(sys.executable), "/usr/local/bin/python3", "/usr/bin/python3"):
        path = Path(os.path.realpath(candidate))
        if path.exists() and all(p.stat().st_mode & 0o001 for p in (path, *path.parents)):
            return str(path)
    pytest.skip("no Python interpreter another user may run")


@contextlib.asynccontextmanager
async def tls_runner(
    tmp_path: Path, functions: Path, pki: TestPKI, *flags: str
) -> AsyncIterator[RunnerProcess]:
    async with fn_runner(tmp_path, functions, tls=pki.directory(RUNNER), flags=flags) as served:
        _serve(served.configs, "labels", "set-labels")
        yield served


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "127.0.0.1:0", "[::1]:0"])
def test_a_plaintext_tcp_port_is_refused_at_start(listen: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kruntimes.workers.fn_runner", "--listen", listen],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "plaintext port" in done.stderr and "--tls DIR" in done.stderr and "unix:PATH" in done.stderr


async def test_a_caller_without_a_platform_identity_is_refused(
    tmp_path: Path, functions: Path, pki: TestPKI
) -> None:
    other = TestPKI.create(tmp_path / "other-ca")
    async with tls_runner(tmp_path, functions, pki) as served:
        member = RemoteEvaluator(served.address, tls=pki.gateway)
        try:
            await _served(member, "example.com/fn/labels:v1.0.0")
        finally:
            await member.close()
        message = pb.EvaluateFunctionRequest(
            image="example.com/fn/labels:v1.0.0", resource_list=request().resource_list
        )
        ca = pki.authority.cert_pem
        strangers = {
            "plaintext": grpc.aio.insecure_channel(served.address),
            "no certificate": grpc.aio.secure_channel(
                served.address,
                grpc.ssl_channel_credentials(root_certificates=ca),
                options=PeerTLS.channel_options(RUNNER_ROLE),
            ),
            "another CA's certificate": grpc.aio.secure_channel(
                served.address,
                pki.impostor(other, Identity.gateway("impostor")).channel_credentials(),
                options=PeerTLS.channel_options(RUNNER_ROLE),
            ),
        }
        for what, channel in strangers.items():
            async with channel:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await pb_grpc.FunctionEvaluatorStub(channel).EvaluateFunction(message, timeout=10)
                assert refused.value.code() in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.UNAUTHENTICATED,
                ), what


async def test_a_caller_past_its_bound_is_refused_while_another_is_served(
    tmp_path: Path, functions: Path, pki: TestPKI
) -> None:
    nap = programs.write(functions, f"nap-{uuid.uuid4().hex[:8]}", NAP)
    flags = ("--max-parallel", "4", "--max-per-caller", "2", "--max-waiting-per-caller", "0")
    async with tls_runner(tmp_path, functions, pki, *flags) as served:
        _serve(served.configs, "nap", nap.name)
        greedy = RemoteEvaluator(served.address, tls=pki.control_plane)
        other = RemoteEvaluator(served.address, tls=pki.gateway)
        try:
            await _served(other, "example.com/fn/labels:v1.0.0")
            slow = [
                asyncio.ensure_future(greedy.evaluate(request("example.com/fn/nap:v1.0.0", timeout=60)))
                for _ in range(2)
            ]
            await eventually(lambda: _running(nap) == 2, timeout=30, what="the greedy caller's two naps run")
            with pytest.raises(errors.ResourceExhausted, match="its bound"):
                await greedy.evaluate(request("example.com/fn/labels:v1.0.0"))
            evaluation = await other.evaluate(request("example.com/fn/labels:v1.0.0"))
            assert evaluation.exit_code == 0, "another caller is served meanwhile"
            for call in slow:
                call.cancel()
            await asyncio.gather(*slow, return_exceptions=True)
            await eventually(lambda: _running(nap) == 0, timeout=30, what="the cancelled naps end")
        finally:
            await greedy.close()
            await other.close()


async def test_krt_fn_eval_reaches_a_tls_runner_with_the_client_configs_platform_certificate(
    tmp_path: Path, functions: Path, pki: TestPKI
) -> None:
    state = tmp_path / "state"
    shutil.copytree(pki.directory(Identity.control_plane("cli")), state / EMBEDDED_TLS)
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "cm.yaml").write_text(
        dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})
    )
    krt = Path(sys.executable).with_name("krt")

    def evaluate(state_dir: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(krt), "fn", "eval", str(package), "--image", "example.com/fn/labels:v1.0.0",
             "--runner", served.address, "--", "remote=yes"],
            capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "KRT_STATE_DIR": str(state_dir)},
        )  # fmt: skip

    async with tls_runner(tmp_path, functions, pki) as served:
        done = await asyncio.to_thread(evaluate, state)
        assert done.returncode == 0, done.stderr
        assert load_all((package / "cm.yaml").read_text())[0]["metadata"]["labels"] == {"remote": "yes"}
        (tmp_path / "empty").mkdir()
        without = await asyncio.to_thread(evaluate, tmp_path / "empty")
        assert without.returncode == 4
        assert "reached with mutual TLS" in without.stderr and "--runner-tls DIR" in without.stderr
    assert (state / EMBEDDED_TLS / CA_CERT).exists()


async def test_the_unix_socket_is_its_owners_alone(tmp_path: Path, functions: Path) -> None:
    async with fn_runner(tmp_path, functions) as served:
        path = served.address.removeprefix("unix:")
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert os.stat(path).st_uid == os.geteuid()
        if os.geteuid() == 0:
            Path(path).parent.chmod(0o755)  # even where others may reach the socket's name
            dial = "import socket, sys\ntry:\n    socket.socket(socket.AF_UNIX).connect(sys.argv[1])\n    print('connected')\nexcept OSError as e:\n    print(type(e).__name__)\n"
            other = subprocess.run(
                [_python_for_others(), "-I", "-c", dial, path], user=65534, group=65534, extra_groups=[],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert other.stdout.strip() == "PermissionError", other.stderr
        with socket.socket(socket.AF_UNIX) as mine:
            mine.connect(path)
