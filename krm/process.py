"""Running a function binary once: ResourceList on stdin, stdout the output, stderr the log.

`start_process` is the one place a function process is started: by the launcher
(`krm/_launcher.py`), a small single-threaded helper process this one keeps per event loop,
which forks, sets the limits in the child and only then execs the binary, so no instruction of
the function runs before its limits hold (a hook between fork and exec in this multi-threaded
process could hang on a lock another thread held). This is how binaries run where this process
cannot sandbox them (not root): as its own user. As root, `krt fn-runner` and `krt fn eval` run
them in the function sandbox instead (a `Runner`: workers/fn_sandbox.py, runtime/binaries.py).
Everything else here is the same for any start:

- the process leads its own process group, in a fresh empty working directory with a clean
  environment, under resource limits (open files, processes, address space, CPU seconds, file
  size, no core files);
- stdout is read up to a bound (past it the group is killed and the output refused), stderr up to
  a bound (the rest is drained and counted, `truncated` set);
- when the process exits, its whole group is killed, so a child it left behind cannot hold the
  pipes open or outlive the evaluation;
- a deadline or a cancellation kills the whole group at once with SIGKILL (a process that
  ignores SIGTERM dies all the same), waits for its end and discards whatever it wrote.
"""

from __future__ import annotations

import array
import asyncio
import atexit
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kruntimes.krm import errors
from kruntimes.system import rlimits

MiB = 1024 * 1024
CHUNK = 64 * 1024
REAP_SECONDS = 5.0
LAUNCHER = Path(__file__).with_name("_launcher.py")
MAX_REQUEST_BYTES = 256 * 1024  # argv and environment of one start, as the launcher reads them
LAUNCHER_STOP_SECONDS = 5.0
# A launcher spends well under a millisecond of CPU per start; it is replaced after as many
# starts as would spend half the CPU limit it holds at that rate.
LAUNCHER_CPU_PER_START_S = 0.001


@dataclass(frozen=True, slots=True)
class Limits:
    open_files: int = 256
    processes: int = 256  # RLIMIT_NPROC counts the user's processes; not enforced for root
    address_space_bytes: int = 2048 * MiB
    cpu_seconds: int = 900
    file_size_bytes: int = 64 * MiB

    def pairs(self) -> list[tuple[int, int]]:
        """(resource, value) of each limit, soft and hard alike (kruntimes.system.rlimits)."""
        return rlimits.pairs(self)


@dataclass(frozen=True, slots=True)
class Outcome:
    stdout: bytes
    stderr: bytes
    stderr_truncated: bool
    exit_code: int  # negative: killed by that signal
    # paths its stderr names that exist on this machine but that its sandbox hides from it
    hidden: tuple[str, ...] = ()


class Runner(Protocol):
    """How the exec evaluator runs a function process to completion: `run` below (this process's
    own user, under limits), or the function sandbox where there is one (workers/fn_sandbox.py).
    It raises the evaluation's errors (`kruntimes.krm.errors`): DeadlineExceeded, OutputTooLarge, and
    SystemError_ for a binary that cannot start."""

    async def __call__(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes,
        deadline: float,
        limits: Limits,
        max_stdout: int,
        max_stderr: int,
    ) -> Outcome: ...


class LauncherGone(OSError):
    """The launcher ended (or could not be reached) before it answered."""


class Started:
    """A function process asked of the launcher: its pid once started (it leads its own process
    group) and its exit code. The caller need not wait for the start: its pipes are in place."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.pid: asyncio.Future[int] = loop.create_future()
        self.exited: asyncio.Future[int] = loop.create_future()  # negative: killed by that signal
        self.killed = False

    def kill(self) -> None:
        """SIGKILL to its whole group, now or as soon as it has started; nothing once it has
        exited (the launcher killed its group then, and the number may be another's now)."""
        self.killed = True
        if self.exited.done():
            return
        if self.pid.done() and not self.pid.exception():
            kill_group(self.pid.result())

    def _started(self, pid: int) -> None:
        if not self.pid.done():
            self.pid.set_result(pid)
        if self.killed:
            kill_group(pid)

    def _failed(self, error: OSError) -> None:
        for future in (self.pid, self.exited):
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: a caller that went away does not warn about it


class Launcher:
    """This event loop's link to its launcher process for one set of limits (`krm/_launcher.py`)."""

    _of_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Limits, Launcher]] = (
        weakref.WeakKeyDictionary()
    )

    @classmethod
    def current(cls, limits: Limits) -> Launcher:
        loop = asyncio.get_running_loop()
        launchers = cls._of_loop.setdefault(loop, {})
        launcher = launchers.get(limits)
        if launcher is not None and launcher.starts >= launcher.max_starts:
            launcher.retire()
        if launcher is None or launcher.gone or launcher.retiring:
            launcher = launchers[limits] = cls(loop, limits)
        return launcher

    def __init__(self, loop: asyncio.AbstractEventLoop, limits: Limits) -> None:
        self.loop = loop
        self.gone = False
        self.retiring = False
        self.starts = 0
        self.max_starts = max(1, int(limits.cpu_seconds / 2 / LAUNCHER_CPU_PER_START_S))
        self._ids = itertools.count(1)
        self._running: dict[int, Started] = {}
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    str(LAUNCHER),
                    str(theirs.fileno()),
                    *(f"{which}={value}" for which, value in limits.pairs()),
                ],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                process_group=0,  # a terminal's signals are not for it
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self.sock = ours
        loop.add_reader(ours.fileno(), self._readable)
        weakref.finalize(loop, Launcher._close_quietly, ours, self.process)

    def start(self, argv: Sequence[str], *, cwd: str, env: dict[str, str], fds: Sequence[int]) -> Started:
        """Ask for the process; `fds` (its stdin, stdout, stderr) may be closed on return."""
        ident = next(self._ids)
        data = json.dumps(
            {"id": ident, "argv": list(argv), "cwd": cwd, "env": env}, separators=(",", ":")
        ).encode()
        if len(data) > MAX_REQUEST_BYTES:
            raise OSError(0, f"the command line and environment are over {MAX_REQUEST_BYTES} bytes")
        if self.gone:
            raise LauncherGone(0, "the launcher has ended")
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
        try:
            # A small message on a socket whose peer reads all the time: a full buffer means the
            # launcher is stuck, so wait for room a bounded while.
            self.sock.settimeout(LAUNCHER_STOP_SECONDS)
            try:
                self.sock.sendmsg([data], ancillary)
            finally:
                self.sock.setblocking(False)
        except OSError as e:
            self._fail(f"cannot reach the launcher: {e}")
            raise LauncherGone(0, f"cannot reach the launcher: {e}") from e
        self.starts += 1
        started = self._running[ident] = Started(self.loop)
        return started

    def retire(self) -> None:
        """Take no more starts; end once what it started has ended."""
        self.retiring = True
        if not self._running:
            self._fail("retired")

    def _readable(self) -> None:
        while True:
            try:
                data = self.sock.recv(64 * 1024)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._fail(f"the launcher's socket failed: {e}")
                return
            if not data:
                self._fail("the launcher ended")
                return
            message = json.loads(data)
            started = self._running.get(message["id"])
            if started is None:
                continue
            if "pid" in message:
                started._started(int(message["pid"]))
            elif "code" in message:
                del self._running[message["id"]]
                if not started.exited.done():
                    started.exited.set_result(int(message["code"]))
                if self.retiring and not self._running:
                    self._fail("retired")
                    return
            else:
                del self._running[message["id"]]
                started._failed(OSError(int(message["errno"]), str(message["error"])))

    def _fail(self, why: str) -> None:
        if self.gone:
            return
        self.gone = True
        with contextlib.suppress(Exception):
            self.loop.remove_reader(self.sock.fileno())
        for started in self._running.values():
            started.kill()  # whatever it started must not outlive it
            started._failed(LauncherGone(0, why))
        self._running.clear()
        self.sock.close()  # end of file: it kills what still runs and ends
        try:
            self.loop.run_in_executor(None, _reap, self.process)
        except RuntimeError:  # the loop is closing
            _reap(self.process)

    @staticmethod
    def _close_quietly(sock: socket.socket, process: subprocess.Popen[bytes]) -> None:
        # End of file tells the launcher to kill what still runs and end.
        sock.close()
        _reap(process)


def _reap(process: subprocess.Popen[bytes]) -> None:
    try:
        process.wait(LAUNCHER_STOP_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def start_process(
    argv: Sequence[str], *, cwd: str, env: dict[str, str], limits: Limits, fds: Sequence[int]
) -> Started:
    """Start one function process on `fds` (its stdin, stdout, stderr), leading its own process
    group, its limits set before it runs."""
    return Launcher.current(limits).start(argv, cwd=cwd, env=env, fds=fds)


def kill_group(pid: int) -> None:
    # Only while the leader is not reaped (the launcher reaps it and then says it exited): its
    # pid, and so its group id, cannot be given to another process until then.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class _Reader(asyncio.Protocol):
    """One output pipe read to end of file: up to `limit` bytes kept; past it `on_over` is called
    once and the rest is counted and dropped."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop, on_over: object = None) -> None:
        self.limit = limit
        self.kept = bytearray()
        self.over = False
        self.on_over = on_over
        self.done: asyncio.Future[None] = loop.create_future()

    def data_received(self, data: bytes) -> None:
        room = self.limit - len(self.kept)
        if len(data) > room:
            self.kept += data[: max(room, 0)]
            if not self.over:
                self.over = True
                if callable(self.on_over):
                    self.on_over()
        else:
            self.kept += data

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


class _Writer(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.done: asyncio.Future[None] = loop.create_future()

    def connection_lost(self, exc: Exception | None) -> None:  # a closed pipe is not an error here
        if not self.done.done():
            self.done.set_result(None)


class _Workdirs:
    """Fresh empty working directories, never used before. Making and removing one is a
    journaled metadata write each on a disk filesystem (about a millisecond apiece on a busy
    disk), so both happen off the evaluation's path: a few are made ahead in a worker thread, and
    a used one is removed in a worker thread once every process of its function is dead."""

    def __init__(self, *, ahead: int) -> None:
        self.ahead = ahead
        self._fresh: list[str] = []
        self._refilling = False
        atexit.register(self.clear)

    def take(self, loop: asyncio.AbstractEventLoop) -> str:
        path = self._fresh.pop() if self._fresh else tempfile.mkdtemp(prefix="krm-fn-")
        if len(self._fresh) < self.ahead and not self._refilling:
            self._refilling = True
            loop.run_in_executor(None, self._refill)
        return path

    def _refill(self) -> None:
        try:
            while len(self._fresh) < self.ahead:
                self._fresh.append(tempfile.mkdtemp(prefix="krm-fn-"))
        except OSError:
            pass  # made when taken instead
        finally:
            self._refilling = False

    def remove(self, loop: asyncio.AbstractEventLoop, path: str) -> None:
        try:
            loop.run_in_executor(None, shutil.rmtree, path, True)
        except RuntimeError:  # the loop is closing
            shutil.rmtree(path, ignore_errors=True)

    def clear(self) -> None:
        while self._fresh:
            shutil.rmtree(self._fresh.pop(), ignore_errors=True)


_WORKDIRS = _Workdirs(ahead=4)


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
    loop = asyncio.get_running_loop()
    workdir = _WORKDIRS.take(loop)
    ours: list[int] = []
    theirs: list[int] = []
    transports: list[asyncio.BaseTransport] = []
    started: Started | None = None
    try:
        for _ in range(3):
            read_end, write_end = os.pipe2(os.O_CLOEXEC)
            ours.append(read_end)
            theirs.append(write_end)
        theirs[0], ours[0] = ours[0], theirs[0]  # the child reads stdin, writes stdout and stderr
        try:
            started = start_process(argv, cwd=workdir, env=_environment(workdir), limits=limits, fds=theirs)
        except OSError as e:
            raise errors.SystemError_(f"cannot start {argv[0]}: {e.strerror or e}") from e
        finally:
            for fd in theirs:
                os.close(fd)
        out = _Reader(max_stdout, loop, on_over=started.kill)
        err = _Reader(max_stderr, loop)
        feed = _Writer(loop)
        stdin_pipe, stdout_pipe, stderr_pipe = (
            os.fdopen(fd, mode, buffering=0) for fd, mode in zip(ours, ("wb", "rb", "rb"), strict=True)
        )
        ours = []  # the file objects own them now
        for connected in await asyncio.gather(
            loop.connect_write_pipe(lambda: feed, stdin_pipe),
            loop.connect_read_pipe(lambda: out, stdout_pipe),
            loop.connect_read_pipe(lambda: err, stderr_pipe),
        ):
            transports.append(connected[0])
        writer = transports[0]
        assert isinstance(writer, asyncio.WriteTransport)
        with contextlib.suppress(OSError):
            writer.write(stdin)
            writer.write_eof()
        try:
            # `deadline` is on time.monotonic(); the loop's clock may be another monotonic clock.
            async with asyncio.timeout_at(loop.time() + (deadline - time.monotonic())) as timer:
                code = await asyncio.shield(started.exited)  # its group killed with it
                await asyncio.gather(out.done, err.done)
        except TimeoutError as e:
            if timer.expired():
                raise errors.DeadlineExceeded("the function ran past its deadline and was killed") from e
            raise
        except LauncherGone as e:
            raise errors.SystemError_(f"{argv[0]}: {e.strerror or e}") from e
        except OSError as e:
            raise errors.SystemError_(f"cannot start {argv[0]}: {e.strerror or e}") from e
        if out.over:
            raise errors.OutputTooLarge(f"the function wrote more than {max_stdout} bytes to stdout")
        return Outcome(bytes(out.kept), bytes(err.kept), err.over, code)
    finally:
        if started is not None:
            started.kill()
            if not started.exited.done():
                with contextlib.suppress(TimeoutError, OSError):
                    await asyncio.wait_for(asyncio.shield(started.exited), REAP_SECONDS)
        for transport in transports:
            transport.close()  # every writer is dead: nothing more comes
        for fd in ours:
            os.close(fd)
        _WORKDIRS.remove(loop, workdir)
