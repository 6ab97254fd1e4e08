"""`krt up` keeps its state directory to its owner: one left open to others is closed before the
platform writes its database, logs and bindings there; one of another user is refused."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kruntimes.workers.embedded.errors import PlatformError
from kruntimes.workers.embedded.layout import Layout, prepare


def test_a_state_directory_open_to_others_is_closed_to_its_owner_alone(tmp_path: Path) -> None:
    root = tmp_path / "state"
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    (root / "temporal.db").write_bytes(b"")
    prepare(Layout(root))
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(Layout(root).logs).st_mode) & 0o077 == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_state_directory_of_another_user_is_refused_with_what_to_do(tmp_path: Path) -> None:
    root = tmp_path / "theirs"
    root.mkdir(mode=0o700)
    os.chown(root, 65534, 65534)
    with pytest.raises(PlatformError, match="belongs to uid 65534.*KRT_STATE_DIR"):
        prepare(Layout(root))
    assert list(root.iterdir()) == [], "nothing is written into it"
