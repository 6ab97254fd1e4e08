"""kruntimes.malloc: the allocator takes the arena limit where it is glibc's (this machine's)."""

from __future__ import annotations

import platform

import pytest

from kruntimes import malloc


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_arena_limit() -> None:
    assert malloc.limit_arenas(2) is True
