"""The scratch directories functions share where they share the host's mounts (no mount namespace
of their own): /tmp, /var/tmp and /dev/shm. A kubelet makes a pod's /tmp emptyDir mode 0777
without the sticky bit, where one uid may delete or replace what another left there; a host whose
functions have uids of their own makes each such directory sticky (1777, as a system's /tmp is)
before any function runs, so only a file's owner removes or renames it. Each function's TMPDIR is
its own workspace (0700) either way: the shared directories hold only what a program puts there by
name.

The way to the host's own state is closed the other way: an ancestor of its state directory that
anyone may write without the sticky bit (a pod's emptyDir root, 0777) would let any function rename
the state directory aside and put one of its own in its place (workspaces, secrets, uid locks the
host then trusts), so the host takes the world's write bit from each such ancestor.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

SHARED_SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")


def make_sticky(paths: tuple[str, ...] = SHARED_SCRATCH) -> tuple[list[str], list[str]]:
    """Add the sticky bit to each of `paths` that anyone may write and that lacks it: (the
    directories changed, the problems: one line per directory that stays so)."""
    changed: list[str] = []
    problems: list[str] = []
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue  # none here: nothing shared
        try:
            mode = stat.S_IMODE(os.fstat(fd).st_mode)
            if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
                try:
                    os.fchmod(fd, mode | stat.S_ISVTX)
                except OSError as e:
                    problems.append(f"{path} (mode {mode:04o}): {e.strerror}")
                else:
                    changed.append(path)
        finally:
            os.close(fd)
    return changed, problems


def close_ancestors(path: Path) -> tuple[list[str], list[str]]:
    """Take the write bit for others from each ancestor of `path` that anyone may write and that
    lacks the sticky bit: (the directories changed, the problems: one line per directory that
    stays so)."""
    changed: list[str] = []
    problems: list[str] = []
    for ancestor in reversed(Path(os.path.realpath(path)).parents):
        try:
            fd = os.open(ancestor, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            problems.append(f"{ancestor}: {e.strerror}")
            continue
        try:
            mode = stat.S_IMODE(os.fstat(fd).st_mode)
            if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
                try:
                    os.fchmod(fd, mode & ~stat.S_IWOTH)
                except OSError as e:
                    problems.append(f"{ancestor} (mode {mode:04o}): {e.strerror}")
                else:
                    changed.append(str(ancestor))
        finally:
            os.close(fd)
    return changed, problems
