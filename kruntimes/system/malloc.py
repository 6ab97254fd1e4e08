"""glibc's allocator, kept from holding memory the process no longer uses. Elsewhere than glibc
each of these does nothing (and says so).

- `limit_arenas`: fewer arenas. A process with threads (gRPC's) otherwise gets up to eight arenas
  a core, and each keeps the memory freed in it for itself: the gateway turns every host's
  heartbeats over and lists the known Runs again and again.
- `Trimmer`: what was freed given back. glibc returns freed memory to the system only from the
  top of its heap, and after large blocks are freed it raises its mmap threshold, so the next
  ones come from the heap too: a burst of large, short-lived allocations (a host's heartbeat
  snapshot of 500 registrations, a visibility page of 1,000 Runs) leaves free pages behind that
  still count in the process's RSS. The trimmer's thread calls `malloc_trim(0)`, which gives
  back every whole free page of every arena (not only the top), every `interval_s` while the
  process allocates and frees, on a thread of its own (ctypes lets go of the GIL).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

M_ARENA_MAX = -8  # mallopt's parameter (glibc's malloc.h)
TRIM_INTERVAL_S = 2.0


class _MallInfo2(ctypes.Structure):
    """glibc's `struct mallinfo2` (2.33 and later): byte counts as size_t."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            *("arena", "ordblks", "smblks", "hblks", "hblkhd"),
            *("usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"),
        )
    ]


def _libc() -> Any:
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


_LIBC = _libc()  # the process's own C library, opened once


def _function(name: str, restype: Any, *argtypes: Any) -> Any:
    """libc's function `name` typed, or None where there is none (not glibc, or too old)."""
    function = getattr(_LIBC, name, None)
    if function is None:
        return None
    function.argtypes = list(argtypes)
    function.restype = restype
    return function


_mallopt = _function("mallopt", ctypes.c_int, ctypes.c_int, ctypes.c_int)
_mallinfo2 = _function("mallinfo2", _MallInfo2)
_malloc_trim = _function("malloc_trim", ctypes.c_int, ctypes.c_size_t)
_prctl = _function(
    "prctl", ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong
)
PR_SET_NAME = 15
THREAD_NAME = "malloc-trim"  # also the thread's name in the system (ps -L, /proc/PID/task/*/comm)


def limit_arenas(count: int = 2) -> bool:
    """Keep at most `count` malloc arenas; whether the allocator took it. Call it before the
    process starts threads: arenas made before stay."""
    return _mallopt is not None and bool(_mallopt(M_ARENA_MAX, count))


def held() -> tuple[int, int] | None:
    """What the allocator's arenas hold, in bytes: (in use, free), or None where it cannot say
    (not glibc, or a glibc before mallinfo2). Free bytes stay counted after a trim gave their
    pages back: they are still the allocator's to hand out."""
    if _mallinfo2 is None:
        return None
    info = _mallinfo2()
    return int(info.uordblks), int(info.fordblks)


def trim() -> bool:
    """Give every whole free page back to the system now; whether any was (False where the
    allocator has no malloc_trim)."""
    return _malloc_trim is not None and bool(_malloc_trim(0))


class Trimmer:
    """A daemon thread that looks at the allocator's arenas every `interval_s` seconds and trims
    them when they changed since its last trim (what is in use or free, by any amount): a busy
    process is trimmed every interval, one at rest not again and again for free memory whose
    pages a trim already gave back (a trim holds the arenas' locks even with nothing to give).
    `start` says whether it runs (not where the allocator
    cannot say what it holds); `stop` ends it and waits for it."""

    def __init__(self, *, interval_s: float = TRIM_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.trims = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        if self._thread is not None:
            return True
        if held() is None:
            return False
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        if _prctl is not None:
            _prctl(PR_SET_NAME, THREAD_NAME.encode(), 0, 0, 0)
        at_trim: tuple[int, int] | None = None  # (in use, free) right after the last trim
        while not self._stop.wait(self.interval_s):
            now = held()
            if now is None or now == at_trim:
                continue
            trim()
            self.trims += 1
            at_trim = held()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
