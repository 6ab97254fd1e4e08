"""What a sandboxed function sees of the file system, in its own mount namespace.

The function must reach a few paths with their real content (`keep`: its workspace, the Python
it runs on) and must not see others (`hide`: the state directory with certificates, keys and
token files, the other workspaces). A kept path may lie under a directory the function cannot
traverse (a Python installed under /root, mode 0700) or under a hidden one (the workspace under
the state directory). The view is built from three operations in the function's mount namespace:

    tmpfs D     an empty in-memory directory over D (mode 0711): D's content disappears; a
                scratch directory (/tmp, /dev/shm) gets a writable one of its own, size-bound
    mkdir P     a directory inside such a tmpfs, on the way to a kept path
    bind P      the real P mounted at P again, so its content shows through

`plan` decides them (pure: it takes the stat of each path); `apply` runs them. Bind sources are
opened before any tmpfs covers their ancestors, so they stay reachable.

Then `seal` makes every mount of the view read-only but the scratch directories and the kept
paths the function may write (`writable`: its workspace, the operator's shared directories),
each of which is a mount of its own for that (a bind onto itself where nothing covers it). A
function so writes nowhere else on the host, whatever the permissions there: not in a
world-writable directory like /var/tmp or /run/lock, where what it left would outlive it, be
found by the next holder of its uid, or fill the host's disk.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from kruntimes.runtime.sandbox import syscalls

COVER_MODE = 0o711  # traversable, not listable: only the names we create lead anywhere

Stat = Callable[[str], os.stat_result | None]


@dataclass(frozen=True, slots=True)
class Op:
    kind: str  # "tmpfs" | "mkdir" | "bind"
    path: str
    options: str = ""  # tmpfs mount options


@dataclass(frozen=True)
class Plan:
    ops: tuple[Op, ...] = ()
    # the mounts `seal` leaves writable: the scratch tmpfs and the binds of writable kept paths
    writable: tuple[str, ...] = ()

    @property
    def binds(self) -> tuple[str, ...]:
        return tuple(op.path for op in self.ops if op.kind == "bind")


def _chain(path: str) -> list[str]:
    """ "/", then every ancestor of the absolute `path`, then `path` itself."""
    parts = [p for p in path.split("/") if p]
    return ["/"] + ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _real_stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def traversable_by_other(st: os.stat_result) -> bool:
    """Whether a process of an unrelated uid and gid may pass through this directory."""
    return bool(st.st_mode & stat.S_IXOTH)


@dataclass
class _Planner:
    hide: frozenset[str]
    scratch: dict[str, int]
    writable: frozenset[str]
    stat_of: Stat
    needs_traversal: bool
    decided: dict[str, str] = field(default_factory=dict)  # path → "tmpfs" | "mkdir" | "bind"

    def covers(self, path: str) -> bool:
        """Whether the function must not see `path`'s real content through it."""
        if path in self.hide or path in self.scratch:
            return True
        if not self.needs_traversal or path == "/":
            return False
        st = self.stat_of(path)
        return st is not None and stat.S_ISDIR(st.st_mode) and not traversable_by_other(st)

    def walk(self, target: str, *, keep: bool) -> None:
        """Decide the path from / to `target`: inside a tmpfs only `target` itself is bound, so
        nothing but the kept paths shows through (their siblings stay hidden)."""
        real = True  # the function sees the real content at this level
        for path in _chain(target):
            last = path == target
            decided = self.decided.get(path)
            if decided is not None:
                real = decided == "bind"
                continue
            if real:
                if last and keep:
                    if path in self.writable and path != "/":
                        self.decided[path] = "bind"  # a mount of its own, which `seal` spares
                    return
                if self.covers(path):
                    self.decided[path] = "tmpfs"
                    real = False
                continue
            if last and not keep:
                return  # under a tmpfs and never created: already invisible
            self.decided[path] = "bind" if last else "mkdir"


def plan(
    *,
    keep: Iterable[str],
    hide: Iterable[str],
    scratch: Mapping[str, int] | None = None,
    writable: Iterable[str] = (),
    needs_traversal: bool,
    stat_of: Stat = _real_stat,
) -> Plan:
    """The operations that make every existing `keep` path reachable with its real content,
    every `hide` directory empty and every `scratch` directory (path → size in bytes) a private
    writable tmpfs; the kept paths also in `writable` stay writable after `seal`.
    `needs_traversal`: the function runs as another uid than the owner of the files, so
    directories without the others' x bit block it and are covered."""
    hidden = frozenset(os.path.normpath(h) for h in hide if _is_dir(stat_of(os.path.normpath(h))))
    scratches = {
        os.path.normpath(path): size
        for path, size in (scratch or {}).items()
        if _is_dir(stat_of(os.path.normpath(path)))
    }
    planner = _Planner(
        hide=hidden,
        scratch=scratches,
        writable=frozenset(os.path.normpath(w) for w in writable),
        stat_of=stat_of,
        needs_traversal=needs_traversal,
    )
    kept = sorted({os.path.normpath(k) for k in keep if stat_of(os.path.normpath(k)) is not None})
    for path in kept:
        planner.walk(path, keep=True)
    for path in sorted(hidden | scratches.keys()):
        planner.walk(path, keep=False)
    ops = [
        Op(kind, path, _tmpfs_options(path, scratches) if kind == "tmpfs" else "")
        for path, kind in planner.decided.items()
    ]
    ops.sort(key=lambda op: (op.path.count("/") if op.path != "/" else 0, op.path))
    spared = tuple(
        op.path
        for op in ops
        if (op.kind == "tmpfs" and op.path in scratches)
        or (op.kind == "bind" and op.path in planner.writable)
    )
    return Plan(tuple(ops), spared)


def _tmpfs_options(path: str, scratch: Mapping[str, int]) -> str:
    size = scratch.get(path)
    if size is None:
        return f"mode={COVER_MODE:o},size=1m"
    return f"mode=1777,size={size}"


def _is_dir(st: os.stat_result | None) -> bool:
    return st is not None and stat.S_ISDIR(st.st_mode)


def apply(view: Plan, *, trees: dict[str, int] | None = None) -> None:
    """Run the plan in this process's (new, private) mount namespace. `trees`: detached mount
    trees (syscalls.open_tree) made in another mount namespace, where those paths are visible,
    attached here instead of a bind; the other bind sources are opened here, before any cover."""
    trees = trees or {}
    sources: dict[str, int] = {}
    try:
        for path in view.binds:
            if path not in trees:
                sources[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
        for op in view.ops:
            if op.kind == "tmpfs":
                syscalls.mount(
                    "tmpfs",
                    op.path,
                    "tmpfs",
                    syscalls.MS_NOSUID | syscalls.MS_NODEV,
                    op.options,
                )
            elif op.kind == "mkdir":
                os.mkdir(op.path, COVER_MODE)
            else:
                source = trees.get(op.path, sources.get(op.path))
                assert source is not None
                if os.path.lexists(op.path):
                    pass  # a path bound onto itself (nothing covers it): its own mount for `seal`
                elif stat.S_ISDIR(os.fstat(source).st_mode):
                    os.mkdir(op.path, COVER_MODE)
                else:
                    os.close(os.open(op.path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600))
                if op.path in trees:
                    syscalls.move_mount(source, op.path)
                else:
                    syscalls.mount(
                        f"/proc/self/fd/{source}", op.path, None, syscalls.MS_BIND | syscalls.MS_REC
                    )
    finally:
        for fd in sources.values():
            os.close(fd)


def seal(writable: Iterable[str]) -> None:
    """Make every mount of this (private) mount namespace read-only, but those at `writable`
    (each a mount point of its own: a plan's `writable`, /proc) keep their write access. Other
    mount flags (nosuid, nodev, noexec) stay as they are."""
    syscalls.mount_setattr("/", add=syscalls.MOUNT_ATTR_RDONLY, recursive=True)
    for path in writable:
        syscalls.mount_setattr(path, clear=syscalls.MOUNT_ATTR_RDONLY)
