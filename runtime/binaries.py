"""The exec evaluator's functions in the function sandbox: a binary run once per evaluation, as a
host runs a krm function's entrypoint once per call (`krt fn-runner`, `krt fn eval --exec`).

Each binary (its command line) is a function of its own here, as a registration is on a host: an
identity (`kruntimes.runtime.isolation.Lease`: a uid claimed on this machine, a cgroup with its limits) and
lanes in its sandbox (runtime/lanes.py: PID and mount namespaces, the file system view without
the hidden directories, no network unless asked, no capabilities). Each evaluation starts the
binary in a lane with the ResourceList on stdin, in a working directory of its own: the lane's
private /tmp, which the lane empties after every call, as it ends every process the call left.
So an evaluation sees nothing of an earlier one but what the binary's own directory holds.

A binary not evaluated for `IDLE_S` gives its identity back (its lanes ended long before, after
`kruntimes.runtime.lanes.LANE_IDLE_S`); at most `MAX_BINARIES` are kept, the least recently used given back
first. Blocking and thread-safe: the caller runs `run` in a thread and, to cancel it, `kill`s the
pid `on_start` gave it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kruntimes.runtime.isolation import FunctionIsolation, Lease
from kruntimes.runtime.lanes import Lanes
from kruntimes.runtime.limits import ProcessLimits
from kruntimes.runtime.outcome import Outcome
from kruntimes.runtime.sandbox.policy import InForce, SandboxSettings
from kruntimes.runtime.spawner import Spawner, SpawnSpec

log = logging.getLogger(__name__)

MAX_BINARIES = 64  # binaries with an identity at once
IDLE_S = 300.0  # a binary not evaluated for this long gives its identity back
SWEEP_S = 5.0
SCRATCH = "/tmp"  # the lane's private tmpfs, emptied after each call: each evaluation's own
ENV_PATH = "/usr/local/bin:/usr/bin:/bin"


# an absolute path in a message: up to a quote, a space or a delimiter around it
_PATHS = re.compile(r"/[^\s'\"(),:;<>`]+")


def _traversable(path: str) -> bool:
    """Whether another uid may reach `path` through its ancestors (each has the others' x bit)."""
    parent = os.path.dirname(path)
    while True:
        try:
            if not os.stat(parent).st_mode & 0o001:
                return False
        except OSError:
            return False
        if parent == "/":
            return True
        parent = os.path.dirname(parent)


class SandboxUnavailable(Exception):
    """This process cannot make the namespaces a sandboxed evaluation needs (it is not root)."""


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def shown_paths(argv: tuple[str, ...]) -> dict[str, str]:
    """What a binary's sandbox shows it of this machine, read-only, beyond what every function
    sees (each path → the argument that named it): the program's directory, and for every
    argument naming an existing absolute path its directory, or itself when a directory — a
    script's directory holds its modules — with the node_modules of that directory's ancestors
    (where Node.js looks for a script's packages). Nothing else of the caller's files."""
    shown = {os.path.dirname(os.path.realpath(argv[0])): argv[0]}
    for arg in argv[1:]:
        if not os.path.isabs(arg) or not os.path.exists(arg):
            continue
        real = os.path.realpath(arg)
        directory = real if os.path.isdir(real) else os.path.dirname(real)
        shown.setdefault(directory, arg)
        ancestor = directory
        while ancestor != "/":
            modules = os.path.join(ancestor, "node_modules")
            if os.path.isdir(modules):
                shown.setdefault(os.path.realpath(modules), arg)
            ancestor = os.path.dirname(ancestor)
    return shown


class HiddenBinary(Exception):
    """The binary lies in a directory functions must never see: showing it its own directory
    would show them that."""


@dataclass(eq=False)
class _Binary:
    lease: Lease
    lanes: Lanes
    last_used: float
    running: int = 0


class SandboxedBinaries:
    def __init__(
        self,
        settings: SandboxSettings,
        *,
        hide: tuple[str, ...] = (),
    ) -> None:
        self.spawner = Spawner()
        self.isolation = FunctionIsolation(settings, host_uid=f"fn-{secrets.token_hex(8)}", hide=hide)
        self.in_force: InForce | None = None
        self._lock = threading.Lock()
        self._binaries: dict[tuple[tuple[str, ...], ProcessLimits], _Binary] = {}
        self._closed = threading.Event()
        self._sweeper: threading.Thread | None = None

    def start(self) -> InForce:
        """Start the zygote and the isolation; SandboxUnavailable where there are no namespaces
        (lanes need PID and mount namespaces), IsolationUnavailable where the settings cannot be
        honoured."""
        self.isolation.check()
        self.spawner.start()
        try:
            if not self.spawner.namespaces:
                raise SandboxUnavailable("this process cannot make PID and mount namespaces (it is not root)")
            self.in_force = self.isolation.start(
                namespaces=True,
                network_namespaces=self.spawner.network_namespaces,
                work_root=Path("/"),  # no workspaces: each evaluation's directory is its /tmp
            )
        except BaseException:
            self.spawner.close()
            raise
        self._sweeper = threading.Thread(target=self._sweep_loop, name="binaries", daemon=True)
        self._sweeper.start()
        return self.in_force

    def run(
        self,
        argv: tuple[str, ...],
        data: bytes,
        timeout_s: float,
        *,
        limits: ProcessLimits,
        stdout_limit: int,
        on_start: Callable[[int], None] | None = None,
    ) -> Outcome:
        """One evaluation of `argv` (its first item an absolute path) under `limits`: `data` on
        stdin, until it ends, writes more than `stdout_limit` to stdout, or `timeout_s` passes
        (the last two kill it, with everything it started)."""
        binary = self._take(argv, limits)
        try:
            return binary.lanes.run(
                data, timeout_s, stdout_limit=stdout_limit, on_start=on_start, stop_past_limit=True
            )
        finally:
            with self._lock:
                binary.running -= 1
                binary.last_used = time.monotonic()

    def hidden(self, argv: tuple[str, ...], text: bytes) -> tuple[str, ...]:
        """The absolute paths `text` (a failed evaluation's stderr) names that exist here but that
        the binary's sandbox does not show it: what to tell the caller it failed on."""
        shown = (*self.isolation.keep, *shown_paths(argv))
        covered = (*self.isolation.hide, SCRATCH, "/dev/shm")
        found: list[str] = []
        for match in _PATHS.finditer(text.decode(errors="replace")):
            path = os.path.normpath(match.group(0))
            if path in found or len(found) >= 3 or not os.path.exists(path):
                continue
            if any(_within(path, s) for s in shown):
                continue
            if any(_within(path, c) for c in covered) or not _traversable(path):
                found.append(path)
        return tuple(found)

    def kill(self, pid: int) -> None:
        """End the lane `on_start` named (a cancelled evaluation): its namespace, every process."""
        self.spawner.kill(pid)

    def count(self) -> int:
        with self._lock:
            return len(self._binaries)

    def _take(self, argv: tuple[str, ...], limits: ProcessLimits) -> _Binary:
        evicted: list[_Binary] = []
        try:
            with self._lock:
                if self._closed.is_set():
                    raise SandboxUnavailable("the sandbox is closed")
                key = (argv, limits)  # a binary's lanes hold the limits they were started with
                binary = self._binaries.get(key)
                if binary is None:
                    while len(self._binaries) >= MAX_BINARIES:
                        idle = [b for b in self._binaries.values() if b.running == 0]
                        if not idle:
                            break  # every one is in use: one more, given back when idle
                        oldest = min(idle, key=lambda b: b.last_used)
                        evicted.append(self._forget(oldest))
                    binary = self._binaries[key] = self._new(argv, limits)
                binary.running += 1
                return binary
        finally:
            for each in evicted:
                self._give_back(each)

    def _new(self, argv: tuple[str, ...], limits: ProcessLimits) -> _Binary:
        """(Under the lock.) The binary's identity and lanes. No workspace: nothing of its own
        outlives an evaluation but what its uid may write on the host's file system."""
        shown = shown_paths(argv)
        for path, named in shown.items():
            for hidden in self.isolation.forbidden:
                if _within(path, hidden):
                    raise HiddenBinary(f"{named} lies in {hidden}, which functions must not see")
        lease = self.isolation.lease(f"fn-{secrets.token_hex(6)}")
        try:
            sandbox = dataclasses.replace(
                lease.base,
                keep=(*lease.base.keep, *shown),
                # a home hidden by rule shows when the command names it itself
                hide=tuple(h for h in lease.base.hide if h not in shown),
            )
            spec = SpawnSpec(
                kind="exec",
                cwd=SCRATCH,
                env={"PATH": ENV_PATH, "HOME": SCRATCH, "TMPDIR": SCRATCH, "LANG": "C.UTF-8"},
                limits=limits,
                argv=argv,
                sandbox=sandbox,
            )
            lanes = Lanes(self.spawner, spec)
        except BaseException:
            self.isolation.release(lease)
            raise
        return _Binary(lease=lease, lanes=lanes, last_used=time.monotonic())

    def _forget(self, binary: _Binary) -> _Binary:
        """(Under the lock.)"""
        for key, each in list(self._binaries.items()):
            if each is binary:
                del self._binaries[key]
        return binary

    def _give_back(self, binary: _Binary) -> None:
        """End its lanes (every process of its calls), then free its identity."""
        try:
            binary.lanes.close()
        finally:
            self.isolation.release(binary.lease)

    def _sweep_loop(self) -> None:
        while not self._closed.wait(SWEEP_S):
            now = time.monotonic()
            with self._lock:
                binaries = list(self._binaries.values())
                stale = [b for b in binaries if b.running == 0 and now - b.last_used >= IDLE_S]
                for binary in stale:
                    self._forget(binary)
            for binary in binaries:
                with contextlib.suppress(Exception):
                    binary.lanes.sweep(now)
            for binary in stale:
                try:
                    self._give_back(binary)
                except Exception:
                    log.exception("giving back an idle binary's identity failed")

    def close(self) -> None:
        """End every lane and give every identity back; stop the zygote."""
        self._closed.set()
        with self._lock:
            binaries, self._binaries = list(self._binaries.values()), {}
        try:
            for binary in binaries:
                try:
                    self._give_back(binary)
                except Exception:
                    log.exception("giving back a binary's identity failed")
        finally:
            self.isolation.close()
            self.spawner.close()
            if self._sweeper is not None:
                self._sweeper.join(SWEEP_S + 1)
