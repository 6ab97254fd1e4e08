"""One unprivileged uid (and gid of the same number) per function, unique on this machine.

Hosts on one machine share the range: a uid is claimed by holding an exclusive `flock` on
`{lock_dir}/{uid}` for as long as a registration uses it, so two hosts (or two platforms) never
hand out the same uid at once, and a host that dies releases its uids with its descriptors.
The lock file says whether its last holder released the uid cleanly: a claim of a uid left
`busy` (its host died) first kills every process still running as that uid. Whatever runs as a
function's uid belongs to that function, and a process left behind must not meet the next
function given the uid.

A uid is marked clean only once no process of it is left in any state: a zombie still counts
toward the next holder's RLIMIT_NPROC (the kernel frees a process's slot when it is reaped,
not when it dies), and a function's processes may still be dying when its namespace or cgroup
was told to end. A release waits for that, bounded (`drain_s`); what is still there then leaves
the uid `busy`, and a claim of a busy uid kills what is left and waits again (`claim_drain_s`) —
a uid that still has processes after that is skipped, never handed out.

What a uid was given beyond its processes (packet-rule elements: runtime/sandbox/egress.py) is
taken back by its host before it releases the uid clean; a claim of a busy uid has it removed
(`scrub`) before the uid is handed out, and a uid whose scrub fails is skipped like one that
still has processes. A new lock file (empty: the uid never had a holder since the lock directory
was made, as after a reboot, which empties the packet rules too) needs no scrub.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_FIRST_UID = 2_000_000_000
DEFAULT_COUNT = 100_000
DEFAULT_LOCK_DIR = "/run/kruntimes/uids"
MAX_KILL_ROUNDS = 20
DRAIN_S = 5.0  # how long a release waits for the last processes of its uid to be reaped
CLAIM_DRAIN_S = 1.0  # how long a claim of a busy uid waits for those it killed
_DRAIN_POLL_S = 0.005


class NoFreeUid(Exception):
    """Every uid of the range is in use on this machine."""


@dataclass(frozen=True)
class UidRange:
    first: int = DEFAULT_FIRST_UID
    count: int = DEFAULT_COUNT

    def __post_init__(self) -> None:
        if self.first < 1000 or self.count < 1 or self.first + self.count > 2**32 - 2:
            raise ValueError(f"uid range {self.first}+{self.count} must lie within 1000..4294967293")

    @classmethod
    def parse(cls, text: str) -> UidRange:
        """`FIRST-LAST` (inclusive)."""
        first, sep, last = text.partition("-")
        if not sep or not first.isdigit() or not last.isdigit() or int(last) < int(first):
            raise ValueError(f"uid range {text!r} is not FIRST-LAST")
        return cls(int(first), int(last) - int(first) + 1)

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.first <= uid < self.first + self.count


_BUSY = b"busy"
_CLEAN = b"clean"
KILL_TIMEOUT_S = 10.0


@dataclass
class Claim:
    uid: int
    fd: int

    @property
    def gid(self) -> int:
        return self.uid


class UidPool:
    """Claims and releases uids of a range; thread-safe within a process."""

    def __init__(
        self,
        uids: UidRange,
        *,
        lock_dir: str = DEFAULT_LOCK_DIR,
        drain_s: float = DRAIN_S,
        claim_drain_s: float = CLAIM_DRAIN_S,
        scrub: Callable[[int], None] | None = None,
    ) -> None:
        self.uids = uids
        self.lock_dir = lock_dir
        self.drain_s = drain_s
        self.claim_drain_s = claim_drain_s
        self.scrub = scrub  # removes what a busy uid's last holder gave it beyond its processes
        self._lock = threading.Lock()
        self._next = 0
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        os.chmod(lock_dir, 0o700)

    def claim(self) -> Claim:
        with self._lock:
            for _ in range(self.uids.count):
                uid = self.uids.first + self._next
                self._next = (self._next + 1) % self.uids.count
                claim = self._try(uid)
                if claim is not None:
                    return claim
        raise NoFreeUid(f"all {self.uids.count} function uids from {self.uids.first} are in use")

    def _try(self, uid: int) -> Claim | None:
        path = os.path.join(self.lock_dir, str(uid))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            raise
        try:
            state = os.pread(fd, 16, 0)
            if state != _CLEAN:
                # its last holder died, or released it with processes left (or it is new)
                kill_uid(uid)
                if not drained(uid, timeout_s=self.claim_drain_s):
                    os.close(fd)  # still `busy`: the next claim tries again
                    return None
                # a new lock file (empty): no holder before, so nothing given to the uid
                if state and self.scrub is not None and not _scrubbed(self.scrub, uid):
                    os.close(fd)
                    return None
            _mark(fd, _BUSY)
        except BaseException:
            os.close(fd)
            raise
        return Claim(uid, fd)

    def release(self, claim: Claim, *, contained: bool, clean: bool = True) -> None:
        """Let others claim the uid. `contained`: the caller already ended every process of the
        function (its PID namespace or cgroup); otherwise every process of the uid is killed.
        Either way the uid is marked clean only once none of its processes is left, zombies
        included (bounded by `drain_s`; otherwise it stays `busy`), and only if `clean` (the
        caller took back all it gave the uid)."""
        try:
            if not contained:
                kill_uid(claim.uid)
            if drained(claim.uid, timeout_s=self.drain_s) and clean:
                _mark(claim.fd, _CLEAN)
        finally:
            with contextlib.suppress(OSError):
                os.close(claim.fd)


def _scrubbed(scrub: Callable[[int], None], uid: int) -> bool:
    try:
        scrub(uid)
    except Exception:  # whatever failed, the uid stays busy: never handed out
        return False
    return True


def _mark(fd: int, state: bytes) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, state, 0)


def processes_of(uid: int) -> list[int]:
    """Live (not zombie) pids whose real or effective uid is `uid`, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as f:
                state = b""
                for line in f:
                    if line.startswith(b"State:"):
                        state = line.split()[1]
                    elif line.startswith(b"Uid:"):
                        real, effective = (int(v) for v in line.split()[1:3])
                        if uid in (real, effective) and state not in (b"Z", b"X"):
                            found.append(int(entry))
                        break
        except (OSError, ValueError, IndexError):
            continue
    return found


def present(uid: int) -> list[int]:
    """Every pid whose effective uid is `uid`, in any state (zombies included: the kernel counts
    them toward the uid's RLIMIT_NPROC until they are reaped). A function's processes have one
    uid for real, effective and saved alike. The owner of a /proc/<pid> directory is its
    process's effective uid, dumpable or not — a stat, cheaper than reading each status."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid == uid:
                found.append(int(entry))
        except OSError:
            continue
    return found


def drained(uid: int, *, timeout_s: float) -> bool:
    """Whether no process of `uid` is left (`present`), waiting up to `timeout_s` for the last
    ones to be reaped."""
    deadline = time.monotonic() + timeout_s
    while present(uid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_DRAIN_POLL_S)
    return True


def kill_uid(uid: int) -> int:
    """SIGKILL every process running as `uid` until none is left; returns how many were found.

    A shell started as `uid` runs `kill -9 -1`: the kernel delivers SIGKILL to every process of
    that uid in one pass (one forking meanwhile is caught by the next round). Becoming the uid
    needs root or CAP_SETUID; the shell is started by subprocess's own fork-exec, safe in a
    process with threads."""
    total = 0
    for _ in range(MAX_KILL_ROUNDS):
        pids = processes_of(uid)
        if not pids:
            return total
        total += len(pids)
        subprocess.run(
            ["/bin/sh", "-c", "kill -9 -1"],
            user=uid,
            group=uid,
            extra_groups=[],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin"},
            timeout=KILL_TIMEOUT_S,
            check=False,
        )
    return total
