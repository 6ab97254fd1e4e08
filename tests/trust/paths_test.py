"""kruntimes.system.paths.under: a path made of identifiers stays under its root, or is refused."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from kruntimes.runtime import errors, workspace
from kruntimes.system.paths import PathEscape, under


def test_plain_components_are_joined_under_the_root(tmp_path: Path) -> None:
    uid = str(uuid.uuid4())
    assert under(tmp_path, f"{uid}.1") == tmp_path / f"{uid}.1"
    assert (
        under(tmp_path, "hosts", "python", "python-0.tls") == tmp_path / "hosts" / "python" / "python-0.tls"
    )


@pytest.mark.parametrize(
    "part", ["", ".", "..", "../x", "a/b", "/etc", "a\\b", "nul\0byte", "x" * 256, "../../../../x.1"]
)
def test_anything_but_one_plain_component_is_refused(tmp_path: Path, part: str) -> None:
    with pytest.raises(PathEscape):
        under(tmp_path, part)


def test_a_symlink_out_of_the_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "out").symlink_to(tmp_path)
    (root / "in").symlink_to(root)
    with pytest.raises(PathEscape):
        under(root, "out")
    assert under(root, "in") == root / "in"


def test_the_runtime_workspace_uses_it(tmp_path: Path) -> None:
    uid = str(uuid.uuid4())
    assert workspace.workdir(tmp_path, f"task-{uid}.1") == tmp_path / f"task-{uid}.1"
    with pytest.raises(errors.InvalidRequest):
        workspace.workdir(tmp_path, "../../../../x.1")
