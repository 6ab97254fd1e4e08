"""A source directory is copied by root from what it opened, never by name again: links are copied
as links (refused when they point out), special files and hard links to another user's files are
refused, the bounds hold while copying, and the policy is checked on the directory it opened."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kruntimes.api.limits import MAX_SOURCE_DIR_BYTES
from kruntimes.runtime.workspace import SourceError, SourcePolicy, open_source, prepare
from tests.support.isolation import require_or_skip

OTHER_UID = 64_000  # a uid that owns nothing here


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path, SourcePolicy]:
    allowed, state = tmp_path / "allowed", tmp_path / "state"
    allowed.mkdir()
    state.mkdir()
    (state / "key.pem").write_text("PRIVATE")
    return allowed, state, SourcePolicy(allowed_roots=(str(allowed),), forbidden=(str(state),))


def _source(allowed: Path) -> Path:
    src = allowed / "fn"
    (src / "pkg").mkdir(parents=True)
    (src / "main.py").write_text("import pkg.mod\n")
    (src / "pkg" / "mod.py").write_text("VALUE = 1\n")
    (src / "run.sh").write_text("echo\n")
    (src / "run.sh").chmod(0o755)
    (src / "alias.py").symlink_to("main.py")
    (src / "lib").symlink_to("pkg", target_is_directory=True)
    return src


def test_the_tree_is_copied_with_links_as_links_and_modes(roots, tmp_path: Path) -> None:
    allowed, _, policy = roots
    src = _source(allowed)
    work = prepare(tmp_path / "work", source_path=str(src), inline=None, policy=policy)
    assert (work / "pkg" / "mod.py").read_text() == "VALUE = 1\n"
    assert os.readlink(work / "alias.py") == "main.py" and os.readlink(work / "lib") == "pkg"
    assert stat.S_IMODE((work / "run.sh").stat().st_mode) == 0o755
    assert (work / "main.py").stat().st_mtime_ns == (src / "main.py").stat().st_mtime_ns


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda src: (src / "leak").symlink_to("/etc/hostname"), "symlink points outside"),
        (lambda src: (src / "up").symlink_to(".."), "symlink points outside"),
        (lambda src: os.mkfifo(src / "pipe"), "not a regular file"),
    ],
    ids=["link to a file outside", "link to the parent", "a FIFO"],
)
def test_what_is_not_the_source_own_is_refused_and_nothing_is_left(
    roots, tmp_path: Path, make, why: str
) -> None:
    allowed, _, policy = roots
    src = _source(allowed)
    make(src)
    with pytest.raises(SourceError, match=why):
        prepare(tmp_path / "work", source_path=str(src), inline=None, policy=policy)
    assert not (tmp_path / "work").exists()


def test_a_hard_link_to_another_users_file_is_refused(roots, tmp_path: Path) -> None:
    """Where the kernel lets a user link a file it does not own (fs.protected_hardlinks=0), the
    link would be a regular file of the source that root copies into a workspace its function
    owns."""
    if os.geteuid() != 0:
        require_or_skip("making a file of another user needs root")
    allowed, _, policy = roots
    src = _source(allowed)
    theirs = tmp_path / "theirs"
    theirs.write_text("not yours")
    os.chown(theirs, OTHER_UID, OTHER_UID)
    os.link(theirs, src / "stolen.txt")
    with pytest.raises(SourceError, match="hard link to a file of another user"):
        prepare(tmp_path / "work", source_path=str(src), inline=None, policy=policy)
    os.unlink(src / "stolen.txt")
    os.link(src / "main.py", src / "same-owner.py")  # a hard link of the owner's own is fine
    work = prepare(tmp_path / "work", source_path=str(src), inline=None, policy=policy)
    assert (work / "same-owner.py").read_text() == "import pkg.mod\n"


def test_the_size_bound_holds_while_copying(roots, tmp_path: Path) -> None:
    allowed, _, policy = roots
    src = _source(allowed)
    with (src / "big.bin").open("wb") as f:
        f.truncate(MAX_SOURCE_DIR_BYTES + 1)
    with pytest.raises(SourceError, match="larger than"):
        prepare(tmp_path / "work", source_path=str(src), inline=None, policy=policy)
    assert not (tmp_path / "work").exists()


def test_the_policy_is_checked_on_the_directory_opened(roots) -> None:
    """What a component swapped for a link after the check by name would do: the name is under
    the allowed root, the directory opened is in the state directory. `open_source` is given
    such a name (as the check by name returned it before the swap) and refuses what it opened."""
    allowed, state, policy = roots
    (state / "certs").mkdir()
    (allowed / "via").symlink_to(state, target_is_directory=True)
    with pytest.raises(SourceError, match="state"):
        open_source(allowed / "via" / "certs", policy, "/swapped")
    (allowed / "fine").mkdir()
    fd, opened = open_source(allowed / "fine", policy, "/fine")
    os.close(fd)
    assert opened == (allowed / "fine").resolve()


def test_a_source_whose_last_component_is_a_link_is_not_opened(roots) -> None:
    allowed, state, policy = roots
    (allowed / "last").symlink_to(state, target_is_directory=True)
    with pytest.raises(SourceError, match="not a readable directory"):
        open_source(allowed / "last", policy, "/last")
