"""The fixture of the tests that run a real embedded platform."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.embedded.platform_support import Embedded
from tests.support.procs import kill


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[Embedded]:
    """A platform started with `krt up --detach`; afterwards `krt down`, then every process it
    was seen made of that still runs is killed by pid."""
    platform = Embedded(tmp_path / "state")
    platform.ok("up", "--detach")
    seen = platform.processes()
    try:
        yield platform
    finally:
        seen |= platform.processes()
        platform.krt("down")
        for proc in seen:
            kill(proc)
