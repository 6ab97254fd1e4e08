"""`krt fn-runner` as a real process for tests: serving on a Unix socket of its own (or, with
`tls`, on a TCP port picked at run time, mutual TLS), reading a FunctionConfig directory, stopped
with SIGTERM (and its exit code checked) at the end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from tests.krm.conftest import eventually


@dataclass
class RunnerProcess:
    address: str
    configs: Path
    pid: int


@contextlib.asynccontextmanager
async def fn_runner(
    tmp_path: Path,
    functions: Path,
    *,
    env: dict[str, str] | None = None,
    tls: Path | None = None,
    flags: tuple[str, ...] = (),
) -> AsyncIterator[RunnerProcess]:
    """`tls`: the runner's certificate directory (then it listens on 127.0.0.1, port 0)."""
    configs = tmp_path / "configs"
    configs.mkdir()
    ready = tmp_path / "ready.json"
    # a socket's path is at most 107 bytes: a short private directory of its own
    sockets = Path(tempfile.mkdtemp(prefix="krt-runner-"))
    listen = (
        ["--listen", f"unix:{sockets / 'fn.sock'}"]
        if tls is None
        else ["--listen", "127.0.0.1:0", "--tls", str(tls)]
    )
    process = subprocess.Popen(
        [
            sys.executable, "-m", "kruntimes.workers.fn_runner", *listen, "--ready-file", str(ready),
            "--functions", str(functions), "--fn-configs", str(configs), "--poll", "0.05", "--log-level", "warning",
            *flags,
        ],
        stdout=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    try:
        await eventually(
            lambda: ready.exists() or process.poll() is not None, timeout=30, what="the runner serves"
        )
        assert process.poll() is None, "the runner exited"
        yield RunnerProcess(json.loads(ready.read_text())["address"], configs, process.pid)
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        for leftover in sockets.iterdir():
            leftover.unlink()
        sockets.rmdir()
