"""Per-registration working directories: the function's source, copied or written, then removed."""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
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


@dataclass(frozen=True)
class SourcePolicy:
    """Where a `source.path` may point. The host copies it as root, so this is what stands
    between a Run's spec and every file of the machine: only under an allowed root, and never a
    forbidden directory (a state directory: certificates, keys, tokens), inside one, or above one."""

    allowed_roots: tuple[str, ...] = ()
    forbidden: tuple[str, ...] = ()

    def check(self, source_path: str) -> Path:
        src = Path(source_path)
        if not src.is_absolute():
            raise SourceError(f"source path {_short(source_path)} must be absolute")
        real = Path(os.path.realpath(src))
        for forbidden in self.forbidden:
            guarded = Path(os.path.realpath(forbidden))
            if real == guarded or guarded in real.parents or real in guarded.parents:
                raise SourceError(
                    f"source path {_short(source_path)} is or holds a directory of the platform's "
                    "state; it is never a source"
                )
        if not any(real == root or root in real.parents for root in map(_real, self.allowed_roots)):
            raise SourceError(
                f"source path {_short(source_path)} is not under an allowed source root "
                "(allowedSourceRoots of the runtimes file); use an inline source or an allowed path"
            )
        return real


def _real(path: str) -> Path:
    return Path(os.path.realpath(path))


def _short(path: str, limit: int = 160) -> str:
    return repr(path if len(path) <= limit else path[: limit - 1] + "…")


def prepare(
    workdir: Path,
    *,
    source_path: str | None,
    inline: list[tuple[str, bytes, bool]] | None,
    policy: SourcePolicy | None = None,
) -> Path:
    """Create `workdir` holding the function's files; the caller removes it with `remove`.
    A source path is checked against `policy` (None: none is allowed)."""
    if workdir.exists():
        remove(workdir)
    workdir.parent.mkdir(parents=True, exist_ok=True)
    try:
        if source_path is not None:
            src = (policy or SourcePolicy()).check(source_path)
            if not src.is_dir():
                raise SourceError(f"source path {_short(source_path)} is not a readable directory")
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
