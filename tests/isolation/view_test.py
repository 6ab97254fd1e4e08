"""What a function's file system view keeps from the host's: what Python needs to import, and
nothing that is there only because of where the host was started."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import kruntimes
from kruntimes.runtime.isolation import python_paths


def test_functions_do_not_see_the_directory_the_host_was_started_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `python -m kruntimes.workers.host` run from a project or home directory puts it first on sys.path
    started_from = tmp_path / "project"
    started_from.mkdir()
    monkeypatch.chdir(started_from)
    monkeypatch.syspath_prepend(str(started_from))
    kept = python_paths()
    assert str(started_from.resolve()) not in kept
    package_root = os.path.dirname(os.path.dirname(os.path.realpath(kruntimes.__file__)))
    assert package_root in kept and os.path.realpath(sys.prefix) in kept, "what imports need stays"
