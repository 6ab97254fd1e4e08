"""The exec evaluator's functions in the function sandbox (runtime/binaries.py), as the exec
evaluator runs a process (`kruntimes.krm.process.Runner`): wiring between the two, which do not know each
other.

`sandboxed_runner` gives the runner and what isolation is in force. Where this process cannot
sandbox (not root: no uids to switch to, no namespaces to make) it gives None, and the exec
evaluator starts binaries as this process's own user (`kruntimes.krm.process.run`); the caller says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TextIO

from kruntimes.krm import errors, process
from kruntimes.runtime.binaries import HiddenBinary, SandboxedBinaries, SandboxUnavailable
from kruntimes.runtime.isolation import describe
from kruntimes.runtime.limits import ProcessLimits
from kruntimes.runtime.outcome import Outcome, Status
from kruntimes.runtime.sandbox.identity import NoFreeUid
from kruntimes.runtime.sandbox.policy import IsolationUnavailable, Network, SandboxSettings
from kruntimes.runtime.spawner import SpawnError
from kruntimes.sdk import config as clientconfig

log = logging.getLogger(__name__)

# What a lane's launcher writes to a call's stderr when the binary could not be started
# (runtime/lanes.py), with the exit code a shell gives a command it cannot run.
_NOT_STARTED = b"kruntimes: function process failed to start: "
_NOT_STARTED_CODE = 127
KILL_WAIT_S = 5.0  # how long a cancelled evaluation waits for its lane to be gone


class SandboxRunner:
    """`kruntimes.krm.process.Runner` on SandboxedBinaries; at most `max_parallel` evaluations at once
    (threads of its own: a lane's call blocks one)."""

    def __init__(self, binaries: SandboxedBinaries, *, max_parallel: int) -> None:
        self.binaries = binaries
        self._threads = ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="fn-eval")

    async def __call__(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes,
        deadline: float,
        limits: process.Limits,
        max_stdout: int,
        max_stderr: int,
    ) -> process.Outcome:
        timeout_s = deadline - time.monotonic()
        if timeout_s <= 0:
            raise errors.DeadlineExceeded("the deadline passed before the function started")
        if not os.path.isabs(argv[0]):
            raise errors.SystemError_(f"cannot start {argv[0]}: not an absolute path")
        loop = asyncio.get_running_loop()
        lane: list[int] = []
        cancelled = False

        def started(pid: int) -> None:  # in the evaluation's thread
            lane.append(pid)
            if cancelled:
                self.binaries.kill(pid)

        limited = ProcessLimits(**dataclasses.asdict(limits))  # the same five bounds

        def call() -> Outcome:
            return self.binaries.run(
                tuple(argv), stdin, timeout_s, limits=limited, stdout_limit=max_stdout, on_start=started
            )

        running = loop.run_in_executor(self._threads, call)
        try:
            outcome = await asyncio.shield(running)
        except asyncio.CancelledError:
            cancelled = True  # the function dies with its lane, at once
            for pid in lane:
                self.binaries.kill(pid)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(running), KILL_WAIT_S)
            raise
        except (SpawnError, NoFreeUid, SandboxUnavailable, HiddenBinary, OSError) as e:
            raise errors.SystemError_(f"cannot start {argv[0]}: {e}") from e
        if outcome.status is Status.TIMED_OUT:
            raise errors.DeadlineExceeded("the function ran past its deadline and was killed")
        stderr = outcome.stderr.data
        if outcome.exit_code == _NOT_STARTED_CODE and stderr.startswith(_NOT_STARTED):
            why = stderr[len(_NOT_STARTED) :].decode(errors="replace").strip()
            raise errors.SystemError_(f"cannot start {why}")
        if outcome.stdout.total > max_stdout:
            raise errors.OutputTooLarge(f"the function wrote more than {max_stdout} bytes to stdout")
        return process.Outcome(
            stdout=outcome.stdout.data,
            stderr=stderr[:max_stderr],
            stderr_truncated=outcome.stderr.truncated or len(stderr) > max_stderr,
            exit_code=outcome.exit_code,
            # a failure on a file the sandbox hides is told as such, not as the function's bug
            hidden=self.binaries.hidden(tuple(argv), stderr) if outcome.exit_code != 0 else (),
        )

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        self.binaries.close()


def sandboxed_runner(
    *, max_parallel: int, network: Network, hide: Sequence[Path] = ()
) -> tuple[SandboxRunner | None, str]:
    """The runner that sandboxes each binary, and what isolation that is; or None where this
    process cannot (then the binaries run as its own user) and why."""
    if os.geteuid() != 0:
        return None, "same-user: not root, so functions run as you and can read what you can"
    binaries = SandboxedBinaries(SandboxSettings(network=network), hide=tuple(str(p) for p in hide))
    try:
        in_force = binaries.start()
    except (SandboxUnavailable, IsolationUnavailable, SpawnError) as e:
        binaries.close()
        log.warning("functions are not sandboxed: %s", e)
        return None, f"same-user: {e}"
    return SandboxRunner(binaries, max_parallel=max_parallel), describe(in_force)


def secret_paths(*, kubeconfig: str | None = None) -> list[Path]:
    """What a function must never see of this machine, beyond what the sandbox hides anyway
    (kruntimes.runtime.isolation.MACHINE_SECRETS: a pod's service account token, Docker's secrets): the
    platform's state directory (client.json: a bearer token; on the embedded platform its keys)
    and a kubeconfig's directory."""
    paths = [clientconfig.state_dir()]
    if kubeconfig:
        paths.append(Path(kubeconfig).expanduser().resolve().parent)
    return paths


class FirstUse:
    """A runner for `krt fn eval`: the sandbox is made when a binary is first run (an image the
    exec evaluator does not serve starts none), and says on `err` when it cannot be."""

    def __init__(self, *, network: Network, hide: Sequence[Path], err: TextIO) -> None:
        self.network, self.hide, self.err = network, hide, err
        self._runner: SandboxRunner | None = None
        self._made = False

    async def __call__(self, argv: Sequence[str], **how: Any) -> process.Outcome:
        """`process.Runner`'s call, passed on as it came."""
        if not self._made:
            self._made = True
            self._runner, isolation = sandboxed_runner(max_parallel=8, network=self.network, hide=self.hide)
            if self._runner is None:
                self.err.write(f"krt: the function runs unsandboxed ({isolation})\n")
        run: process.Runner = self._runner or process.run
        return await run(argv, **how)

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
