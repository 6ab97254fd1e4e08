"""Tests of the isolation core skip where the machine cannot isolate (not root, no PID namespaces,
no writable cgroup), and fail there instead when KRT_REQUIRE_ISOLATION=1 (.ci/run sets it), so CI
can never pass with the isolation core skipped. Locally the skips stay; `-rs` lists their reasons.

`require_or_skip(reason)` inside a test or fixture; `needing(available, reason)` as a module's
autouse fixture (`isolation_needed = needing(ROOT, "switching uids needs root")`) where a
`pytestmark = pytest.mark.skipif(...)` would otherwise stand."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NoReturn

import pytest

REQUIRE = "KRT_REQUIRE_ISOLATION"


def required() -> bool:
    """Whether this run must isolate: a skip for a missing mechanism is then a failure."""
    return os.environ.get(REQUIRE, "") not in ("", "0")


def require_or_skip(reason: str) -> NoReturn:
    """Skip the test for `reason` (a mechanism of isolation this machine lacks), or fail it when
    the run requires isolation."""
    if required():
        pytest.fail(f"{REQUIRE} is set, but {reason}", pytrace=False)
    pytest.skip(reason)


def needing(available: bool, reason: str) -> Callable[[], None]:
    """An autouse fixture (assign it to a module attribute): every test of the module skips, or
    fails when isolation is required, unless `available`."""

    @pytest.fixture(autouse=True, scope="module")
    def isolation_needed() -> None:
        if not available:
            require_or_skip(reason)

    return isolation_needed
