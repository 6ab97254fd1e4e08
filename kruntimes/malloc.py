"""glibc's allocator, told to keep fewer arenas. A process with threads (gRPC's) otherwise gets
up to eight arenas a core, and each keeps the memory freed in it for itself: the gateway, which
turns every host's heartbeats over and lists the known Runs again and again, held some 5 MB more
with 10,000 routes that way (bench/gateway_memory.py). Elsewhere than glibc this does nothing."""

from __future__ import annotations

import ctypes

M_ARENA_MAX = -8  # mallopt's parameter (glibc's malloc.h)


def limit_arenas(count: int = 2) -> bool:
    """Keep at most `count` malloc arenas; whether the allocator took it. Call it before the
    process starts threads: arenas made before stay."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, count))
