"""The scratch directories functions share where they share the host's mounts (no mount namespace
of their own): /tmp, /var/tmp and /dev/shm. A kubelet makes a pod's /tmp emptyDir mode 0777
without the sticky bit, where one uid may delete or replace what another left there; a host whose
functions have uids of their own makes each such directory sticky (1777, as a system's /tmp is)
before any function runs, so only a file's owner removes or renames it. Each function's TMPDIR is
its own workspace (0700) either way: the shared directories hold only what a program puts there by
name.
"""

from __future__ import annotations

import os
import stat

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
