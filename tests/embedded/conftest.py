"""The fixture of the tests that run a real embedded platform."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.embedded import Embedded, embedded_platform


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[Embedded]:
    """A platform started with `krt up --detach`; afterwards `krt down`, then every process it
    was seen made of that still runs is killed by pid."""
    with embedded_platform(tmp_path / "state") as platform:
        yield platform
