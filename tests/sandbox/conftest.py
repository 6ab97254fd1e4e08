"""Helpers for the sandbox tests: most mechanisms need root (CI runs as root); where they are
unavailable the tests check the fallback the host uses instead."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="switching uids and making cgroups needs root")


def wait_until(condition: Callable[[], bool], *, timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
