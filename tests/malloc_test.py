"""kruntimes.system.malloc: the allocator takes the arena limit where it is glibc's (this machine's), and
the trimmer gives back the free memory a burst of short-lived allocations left behind."""

from __future__ import annotations

import platform
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kruntimes.system import malloc
from tests.support.procs import thread_names
from tests.support.waiting import wait_until

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt and malloc_trim are glibc's")

BLOCK = 8 * 1024  # above CPython's small-object limit: each one is glibc's (its main arena here)
BURST = 6_000  # ~48 MB
ROOT = Path(__file__).resolve().parent.parent


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@glibc
def test_glibc_takes_the_arena_limit() -> None:
    assert malloc.limit_arenas(2) is True


@glibc
def test_the_trimmer_gives_back_what_a_burst_left_free() -> None:
    """In a process of its own: the test process has other threads (earlier tests' gRPC and
    Temporal clients) whose allocations would change the arenas while the trimmer is watched."""
    run = subprocess.run(
        [sys.executable, "-c", "from tests.malloc_test import burst_then_trim; burst_then_trim()"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout == "given back\n"


def burst_then_trim() -> None:
    # A burst of large blocks, every 16th kept: the rest is freed in the middle of the heap,
    # where glibc keeps it (its top is held by the kept ones), and still counts in the RSS.
    burst = [bytearray(BLOCK) for _ in range(BURST)]
    kept = burst[::16]
    del burst
    held = malloc.held()
    assert held is not None and held[1] > 32 * 1024 * 1024, held
    before = rss_bytes()
    trimmer = malloc.Trimmer(interval_s=0.02)
    assert trimmer.start() is True
    try:
        assert wait_until(lambda: trimmer.trims >= 1), "the trimmer never trimmed"
        assert malloc.THREAD_NAME in thread_names(), "its thread is not named in the system"
        given_back = before - rss_bytes()
        assert given_back > 24 * 1024 * 1024, f"only {given_back >> 20} MB given back"
        trims = trimmer.trims
        # Its free pages given back, the heap holds as many free bytes as before (the allocator's
        # to hand out again), and nothing changed: it looks, and does not trim again.
        assert not wait_until(lambda: trimmer.trims > trims + 1, within=0.5)
        # The same memory used and freed again (its pages back in the RSS) is trimmed again.
        trims, rest = trimmer.trims, rss_bytes()
        again = [bytearray(BLOCK) for _ in range(BURST)]
        grown = rss_bytes() - rest
        kept += again[::64]  # the process changed meanwhile, as a running one does
        del again
        assert wait_until(lambda: trimmer.trims > trims and rss_bytes() - rest < grown / 4), (
            f"{trimmer.trims - trims} trims, {(rss_bytes() - rest) >> 20} MB of {grown >> 20} MB kept"
        )
    finally:
        trimmer.stop()
    assert len(kept) > BURST // 16  # held to the end: the top of the heap stays taken
    assert not any(t.name == "malloc-trim" for t in threading.enumerate()), "stop() left its thread"
    print("given back")


@glibc
def test_trim_says_whether_it_gave_anything_back() -> None:
    burst = [bytearray(BLOCK) for _ in range(2_000)]
    kept = burst[::16]
    del burst
    assert malloc.trim() is True
    assert len(kept) == 2_000 // 16
