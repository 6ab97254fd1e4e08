"""Running a function binary once: ResourceList on stdin, stdout the output, stderr the log.

`start_process` is the one place a function process is started; the runtime's function sandbox
(own uid, namespaces) replaces it later. Everything else here is the same for any start:

- the process leads its own session and process group, in a fresh empty working directory with a
  clean environment, under resource limits (open files, processes, address space, CPU seconds,
  file size, no core files);
- stdout is read up to a bound (past it the group is killed and the output refused), stderr up to
  a bound (the rest is drained and counted, `truncated` set);
- when the process exits, its whole group is killed, so a child it left behind cannot hold the
  pipes open or outlive the evaluation;
- a deadline or a cancellation kills the whole group at once with SIGKILL (a process that
  ignores SIGTERM dies all the same), reaps it and discards whatever it wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

from krm import errors
from kruntimes import rlimits

MiB = 1024 * 1024
CHUNK = 64 * 1024
REAP_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Limits:
    open_files: int = 256
    processes: int = 256  # RLIMIT_NPROC counts the user's processes; not enforced for root
    address_space_bytes: int = 2048 * MiB
    cpu_seconds: int = 900
    file_size_bytes: int = 64 * MiB


@dataclass(frozen=True, slots=True)
class Outcome:
    stdout: bytes
    stderr: bytes
    stderr_truncated: bool
    exit_code: int  # negative: killed by that signal


async def start_process(
    argv: Sequence[str], *, cwd: str, env: dict[str, str], limits: Limits
) -> asyncio.subprocess.Process:
    """Start one function process with pipes on stdin/stdout/stderr, leading its own process group."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=env,
        start_new_session=True,
        close_fds=True,
    )
    # Set on the started process from outside (prlimit): a hook in the child between fork and exec
    # would run Python code in a forked copy of a multi-threaded server. The function sandbox
    # sets them before exec instead.
    rlimits.apply(limits, pid=process.pid)
    return process


def _kill_group(pid: int) -> None:
    # The group id is the leader's pid, and Linux does not hand that number out again while any
    # member of the group lives, so this reaches our group or nothing.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def _feed(stream: asyncio.StreamWriter | None, data: bytes) -> None:
    if stream is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stream.write(data)
        await stream.drain()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError, OSError):
        stream.close()


async def _read_stdout(stream: asyncio.StreamReader | None, *, limit: int, pid: int) -> bytes:
    if stream is None:
        return b""
    parts: list[bytes] = []
    size = 0
    while chunk := await stream.read(CHUNK):
        size += len(chunk)
        if size > limit:
            _kill_group(pid)
            raise errors.OutputTooLarge(f"the function wrote more than {limit} bytes to stdout")
        parts.append(chunk)
    return b"".join(parts)


async def _read_stderr(stream: asyncio.StreamReader | None, *, limit: int) -> tuple[bytes, bool]:
    if stream is None:
        return b"", False
    kept = bytearray()
    truncated = False
    while chunk := await stream.read(CHUNK):
        room = limit - len(kept)
        if len(chunk) > room:
            truncated = True
            kept += chunk[: max(room, 0)]
        else:
            kept += chunk
    return bytes(kept), truncated


def _environment(workdir: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8", "TMPDIR": workdir}


async def run(
    argv: Sequence[str],
    *,
    stdin: bytes,
    deadline: float,
    limits: Limits,
    max_stdout: int,
    max_stderr: int,
) -> Outcome:
    """Run `argv` to completion before `deadline` (a `time.monotonic()` instant)."""
    workdir = tempfile.mkdtemp(prefix="krm-fn-")
    try:
        try:
            process = await start_process(argv, cwd=workdir, env=_environment(workdir), limits=limits)
        except OSError as e:
            raise errors.SystemError_(f"cannot start {argv[0]}: {e.strerror or e}") from e
        tasks: list[asyncio.Task[object]] = []
        try:
            # `deadline` is on time.monotonic(); the loop's clock may be another monotonic clock.
            loop_deadline = asyncio.get_running_loop().time() + (deadline - time.monotonic())
            async with asyncio.timeout_at(loop_deadline) as timer:
                feed = asyncio.ensure_future(_feed(process.stdin, stdin))
                out = asyncio.ensure_future(_read_stdout(process.stdout, limit=max_stdout, pid=process.pid))
                err = asyncio.ensure_future(_read_stderr(process.stderr, limit=max_stderr))
                tasks = [feed, out, err]
                code = await process.wait()
                _kill_group(process.pid)
                stdout = await out
                stderr, truncated = await err
                await feed
            return Outcome(stdout, stderr, truncated, code)
        except TimeoutError as e:
            if timer.expired():
                raise errors.DeadlineExceeded("the function ran past its deadline and was killed") from e
            raise
        finally:
            _kill_group(process.pid)
            if process.returncode is None:
                with contextlib.suppress(TimeoutError, ProcessLookupError):
                    await asyncio.wait_for(asyncio.shield(process.wait()), REAP_SECONDS)
            pending = [task for task in tasks if not task.done()]
            if pending:
                # Every writer is dead: the readers reach end of file, which closes the pipes.
                await asyncio.wait(pending, timeout=REAP_SECONDS)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
