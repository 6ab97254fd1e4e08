"""A cgroup per function where the kernel offers a writable one: a memory limit across all the
function's processes, a cap on its processes and threads, and a way to end them all.

cgroup v2 (one unified tree) is used when this process's own cgroup delegates the `memory` and
`pids` controllers to its children; otherwise cgroup v1 (a tree per controller) when its
`memory` and `pids` hierarchies are writable. Inside most Kubernetes pods neither is writable:
`detect` then returns None and the caller falls back to rlimits and the per-function uid.

Layout: {controller root}/{own cgroup}/kruntimes-{host uid}/{slot}.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

ROOT = "/sys/fs/cgroup"
REMOVE_TIMEOUT_S = 5.0
_POLL_S = 0.01


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _own_paths(proc_cgroup: str) -> dict[str, str]:
    """controller (or "" for v2) → this process's cgroup path, from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    return paths


@dataclass(frozen=True)
class Cgroups:
    """Where this host makes its functions' cgroups."""

    version: int  # 1 or 2
    bases: tuple[str, ...]  # the host's directory in each hierarchy used

    def describe(self) -> str:
        return f"cgroup v{self.version}"

    def group(self, slot: str) -> FunctionGroup:
        if not slot or "/" in slot or slot in (".", ".."):
            raise ValueError(f"cgroup slot {slot!r} is not one path component")
        return FunctionGroup(self.version, tuple(os.path.join(b, slot) for b in self.bases))

    def remove(self) -> None:
        for base in self.bases:
            with contextlib.suppress(OSError):
                os.rmdir(base)


def detect(host_uid: str, *, root: str = ROOT) -> Cgroups | None:
    """The host's cgroup directories, created now, or None where no writable cgroup exists."""
    try:
        own = _own_paths(_read("/proc/self/cgroup"))
    except OSError:
        return None
    name = f"kruntimes-{host_uid}"
    unified = os.path.join(root, "cgroup.controllers")
    if os.path.exists(unified):
        base = os.path.join(root, own.get("", "/").lstrip("/"))
        try:
            delegated = set(_read(os.path.join(base, "cgroup.subtree_control")).split())
        except OSError:
            delegated = set()
        if {"memory", "pids"} <= delegated:
            path = os.path.join(base, name)
            try:
                os.makedirs(path, exist_ok=True)
                _write(os.path.join(path, "cgroup.subtree_control"), "+memory +pids")
            except OSError:
                return None
            return Cgroups(2, (path,))
        return None
    bases = []
    for controller in ("memory", "pids"):
        hierarchy = os.path.join(root, controller)
        if not os.path.isdir(hierarchy):
            return None
        base = os.path.join(hierarchy, own.get(controller, "/").lstrip("/"), name)
        try:
            os.makedirs(base, exist_ok=True)
        except OSError:
            return None
        bases.append(base)
    if not _writable_v1(bases[0]):
        Cgroups(1, tuple(bases)).remove()
        return None
    return Cgroups(1, tuple(bases))


def _writable_v1(base: str) -> bool:
    probe = os.path.join(base, ".probe")
    try:
        os.mkdir(probe)
        _write(os.path.join(probe, "memory.limit_in_bytes"), str(1 << 40))
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)
    return True


@dataclass
class FunctionGroup:
    """One function's cgroup (a directory per hierarchy)."""

    version: int
    paths: tuple[str, ...]
    made: list[str] = field(default_factory=list, init=False)  # the directories this object made

    @property
    def created(self) -> bool:
        return bool(self.made)

    def create(self, *, memory_bytes: int | None, max_processes: int | None) -> None:
        """Make the group's directories, each one new (FileExistsError if any was there: a group
        is never shared with another function, nor joined with what a previous one left), then
        set the limits."""
        for path in self.paths:
            try:
                os.mkdir(path)
            except BaseException:
                self.remove()
                raise
            self.made.append(path)
        if self.version == 2:
            (path,) = self.paths
            if memory_bytes is not None:
                _write(os.path.join(path, "memory.max"), str(memory_bytes))
                with contextlib.suppress(OSError):  # no swap accounting: nothing to cap
                    _write(os.path.join(path, "memory.swap.max"), "0")
            if max_processes is not None:
                _write(os.path.join(path, "pids.max"), str(max_processes))
            return
        memory, pids = self.paths
        if memory_bytes is not None:
            _write(os.path.join(memory, "memory.limit_in_bytes"), str(memory_bytes))
            with contextlib.suppress(OSError):  # memory+swap: only where swap is accounted
                _write(os.path.join(memory, "memory.memsw.limit_in_bytes"), str(memory_bytes))
        if max_processes is not None:
            _write(os.path.join(pids, "pids.max"), str(max_processes))

    @property
    def procs_files(self) -> tuple[str, ...]:
        """Where a process writes "0" to join the group (every hierarchy)."""
        return tuple(os.path.join(p, "cgroup.procs") for p in self.paths)

    def pids(self) -> list[int]:
        return self._pids(self.paths)

    @staticmethod
    def _pids(paths: Iterable[str]) -> list[int]:
        found: set[int] = set()
        for procs in (os.path.join(p, "cgroup.procs") for p in paths):
            with contextlib.suppress(OSError, ValueError):
                found.update(int(line) for line in _read(procs).split())
        return sorted(found)

    def oom_kills(self) -> int:
        """How many processes of the group the kernel killed for memory."""
        path = self.paths[0]
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in _read(os.path.join(path, name)).splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def kill(self) -> None:
        """SIGKILL every process of the group, until it is empty (bounded). Only in the
        directories this object made: one found there already is not this function's."""
        if self.version == 2 and self.made:
            with contextlib.suppress(OSError):
                _write(os.path.join(self.made[0], "cgroup.kill"), "1")
        deadline = time.monotonic() + REMOVE_TIMEOUT_S
        while True:
            pids = self._pids(self.made)
            if not pids or time.monotonic() > deadline:
                return
            _kill_all(pids)
            time.sleep(_POLL_S)

    def remove(self) -> None:
        """Kill what is left and remove the directories (a process still exiting is waited for)."""
        if not self.made:
            return
        self.kill()
        deadline = time.monotonic() + REMOVE_TIMEOUT_S
        for path in self.made:
            while True:
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        break
                    time.sleep(_POLL_S)
        self.made.clear()


def _kill_all(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def join(procs_files: Iterable[str]) -> None:
    """Move the calling process into the group (before it starts anything)."""
    for procs in procs_files:
        _write(procs, "0")
