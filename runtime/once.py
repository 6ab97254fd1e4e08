"""One-shot executions: start a function process, give it its input, wait for it to end (blocking).

A bash invocation and every task run this way. The input goes to stdin (exec) or as one framed
call on the control socket (python); stdout/stderr are captured within bounds, and a timeout
kills the process group.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

from kruntimes.api.limits import MAX_LOG_BYTES
from kruntimes.runtime import framing
from kruntimes.runtime.capture import Capture
from kruntimes.runtime.framing import FrameTooLarge
from kruntimes.runtime.outcome import Outcome, Status, apply_frame, set_error, set_exit, set_too_large
from kruntimes.runtime.pipes import POLL_TICK_S, Pump, child_pipes
from kruntimes.runtime.spawner import EXIT_GRACE_S, Exit, Spawner, SpawnSpec


def run_once(
    spawner: Spawner,
    spec: SpawnSpec,
    data: bytes,
    timeout_s: float,
    *,
    stdout_limit: int = MAX_LOG_BYTES,
    on_start: Callable[[int], None] | None = None,
) -> Outcome:
    """Start a process, give it `data` (python: one framed call; exec: stdin), wait for its end.

    `on_start` receives the pid (for cancellation); the caller's kill ends the run early.
    """
    started = time.monotonic()
    outcome = Outcome(Status.SUCCEEDED, stdout=Capture(stdout_limit))
    out_r, out_w, err_r, err_w = child_pipes()
    ctl: socket.socket | None = None
    if spec.kind == "exec":
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(in_w, False)
        child_fds = [in_r, out_w, err_w]
    else:
        ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ctl.setblocking(False)
        in_r, in_w = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1
        child_fds = [in_r, out_w, err_w, theirs.fileno()]
    try:
        pid, exit = spawner.spawn(spec, child_fds)
    except Exception:
        for fd in (out_r, err_r, in_w):
            if fd >= 0:
                os.close(fd)
        if ctl is not None:
            ctl.close()
        raise
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        if ctl is not None:
            theirs.close()
    if on_start is not None:
        on_start(pid)
    pump = Pump(out_fd=out_r, err_fd=err_r, stdout=outcome.stdout, stderr=outcome.stderr)
    try:
        if ctl is None:
            pump.want_write(in_w, data)
            _wait_exec(pump, exit, started + timeout_s)
        else:
            pump.want_frame(ctl)
            _call_once(pump, ctl, outcome, data, started + timeout_s)
    except FrameTooLarge:
        set_too_large(outcome)
    except TimeoutError:
        set_error(outcome, Status.TIMED_OUT, "Timeout", f"did not finish within {timeout_s:g}s")
    finally:
        spawner.kill(pid)  # the process, or whatever it left running in its group
        exit.wait(EXIT_GRACE_S)
        pump.drain()
        for fd in (out_r, err_r):
            os.close(fd)
        if pump.writer is not None and pump.writer != pump.ctl:
            os.close(pump.writer)
        if ctl is not None:
            ctl.close()
        outcome.duration_us = int((time.monotonic() - started) * 1e6)
    if outcome.status is Status.TIMED_OUT:
        outcome.exit_code = exit.code if exit.code is not None else -9
    elif ctl is None:
        set_exit(outcome, exit.code)
    else:
        outcome.exit_code = 0 if outcome.status is Status.SUCCEEDED else 1
    return outcome


def _wait_exec(pump: Pump, exit: Exit, deadline: float) -> None:
    """Until the process has exited and its output pipes are closed (or it exited a tick ago)."""
    while not (exit.done and not pump.open_readers):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        if exit.done:  # exited, but something it started still holds the pipes
            pump.step(min(remaining, POLL_TICK_S))
            return
        if pump.waiting:
            pump.step(min(remaining, POLL_TICK_S))
        else:
            exit.wait(min(remaining, POLL_TICK_S))


def _call_once(pump: Pump, ctl: socket.socket, outcome: Outcome, data: bytes, deadline: float) -> None:
    """Load the handler, send one request, take its result."""
    ready = False
    while True:
        frame = pump.next_frame()
        if frame is not None:
            if not ready and frame[0] == framing.READY:
                ready = True
                pump.want_write(ctl.fileno(), framing.encode_invoke("task", data))
                continue
            apply_frame(outcome, *frame)
            return
        if pump.ctl_eof:
            set_error(outcome, Status.PROCESS_EXITED, "ProcessExited", "the function process exited early")
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        pump.step(min(remaining, POLL_TICK_S))
