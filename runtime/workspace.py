"""Per-registration working directories: the function's source, copied or written, then removed."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from kruntimes.api.limits import (
    MAX_INLINE_FILES,
    MAX_INLINE_SOURCE_BYTES,
    MAX_SOURCE_DIR_BYTES,
    MAX_SOURCE_DIR_FILES,
)
from kruntimes.api.names import validate_relative_file_name
from kruntimes.paths import PathEscape, under
from runtime.errors import InvalidRequest


class SourceError(Exception):
    """The source cannot be used: the message says which file and why."""


def _check_tree(root: Path) -> None:
    files = 0
    size = 0
    real_root = root.resolve()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if path.is_symlink():
                target = path.resolve()
                if real_root != target and real_root not in target.parents:
                    raise SourceError(
                        f"{path.relative_to(root)}: symlink points outside the source directory"
                    )
        for name in filenames:
            path = Path(dirpath) / name
            mode = path.lstat().st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                raise SourceError(f"{path.relative_to(root)}: not a regular file")
            files += 1
            size += path.lstat().st_size
            if files > MAX_SOURCE_DIR_FILES:
                raise SourceError(f"source directory has more than {MAX_SOURCE_DIR_FILES} files")
            if size > MAX_SOURCE_DIR_BYTES:
                raise SourceError(f"source directory is larger than {MAX_SOURCE_DIR_BYTES} bytes")


def workdir(root: Path, name: str) -> Path:
    """The working directory `name` (one plain component, e.g. `<run uid>.<attempt>`) under the
    work root `root`; InvalidRequest if it would not stay under it."""
    try:
        return under(root, name)
    except PathEscape as exc:
        raise InvalidRequest(f"workspace {name!r:.80}: {exc}") from exc


def prepare(workdir: Path, *, source_path: str | None, inline: list[tuple[str, bytes, bool]] | None) -> Path:
    """Create `workdir` holding the function's files; the caller removes it with `remove`."""
    if workdir.exists():
        remove(workdir)
    workdir.parent.mkdir(parents=True, exist_ok=True)
    try:
        if source_path is not None:
            src = Path(source_path)
            if not src.is_absolute():
                raise SourceError(f"source path {source_path!r} must be absolute")
            if not src.is_dir():
                raise SourceError(f"source path {source_path!r} is not a readable directory")
            _check_tree(src)
            shutil.copytree(src, workdir, symlinks=True)
        else:
            _write_inline(workdir, inline or [])
    except SourceError:
        remove(workdir)
        raise
    except OSError as exc:
        remove(workdir)
        raise SourceError(f"cannot prepare the workspace: {exc.strerror or exc}") from exc
    return workdir


def _write_inline(workdir: Path, files: list[tuple[str, bytes, bool]]) -> None:
    if len(files) > MAX_INLINE_FILES:
        raise SourceError(f"inline source has more than {MAX_INLINE_FILES} files")
    if sum(len(content) for _, content, _ in files) > MAX_INLINE_SOURCE_BYTES:
        raise SourceError(f"inline source is larger than {MAX_INLINE_SOURCE_BYTES} bytes")
    workdir.mkdir(mode=0o700)
    for name, content, executable in files:
        try:
            validate_relative_file_name(name)
        except ValueError as exc:
            raise SourceError(f"inline file {name!r}: {exc}") from exc
        path = workdir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        if executable:
            path.chmod(0o755)


def remove(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)
