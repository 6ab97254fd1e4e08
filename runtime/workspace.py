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
from kruntimes.runtime.errors import InvalidRequest
from kruntimes.system.paths import PathEscape, under


class SourceError(Exception):
    """The source cannot be used: the message says which file and why."""


COPY_CHUNK = 1 << 20
OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
CREATE_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class _Budget:
    files: int = 0
    bytes: int = 0

    def take(self, files: int = 0, size: int = 0) -> None:
        self.files += files
        self.bytes += size
        if self.files > MAX_SOURCE_DIR_FILES:
            raise SourceError(f"source directory has more than {MAX_SOURCE_DIR_FILES} files")
        if self.bytes > MAX_SOURCE_DIR_BYTES:
            raise SourceError(f"source directory is larger than {MAX_SOURCE_DIR_BYTES} bytes")


def _copy_file(name: str, dir_fd: int, dst: Path, owner: int, shown: str, budget: _Budget) -> None:
    """Copy the regular file `name` of the directory `dir_fd` to `dst`, from the file it opened:
    never through a link, never a FIFO or device swapped in since it was listed, never a hard link
    to another user's file (a user who may link another's file, where the kernel allows it, would
    otherwise have it copied by root into a workspace its function owns)."""
    try:
        src = os.open(name, OPEN_FILE, dir_fd=dir_fd)
    except OSError as exc:
        raise SourceError(f"{shown}: cannot open: {exc.strerror}") from exc
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            raise SourceError(f"{shown}: not a regular file")
        if st.st_nlink > 1 and st.st_uid != owner:
            raise SourceError(f"{shown}: a hard link to a file of another user than the directory's")
        out = os.open(dst, CREATE_FILE, stat.S_IMODE(st.st_mode) & 0o777)
        try:
            while chunk := os.read(src, COPY_CHUNK):
                budget.take(size=len(chunk))
                os.write(out, chunk)
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(out)
    finally:
        os.close(src)


def _copy_tree(root_fd: int, opened: Path, workdir: Path) -> None:
    """Copy the directory open as `root_fd` (at `opened`) to the new directory `workdir`, walking
    it by descriptors (os.fwalk: a directory swapped for a link meanwhile is not entered). Links
    are copied as links, and refused when they point outside the source; anything that is not a
    directory, a regular file or a link is refused."""
    root = os.fstat(root_fd)
    budget = _Budget()
    modes: list[tuple[Path, int]] = []
    workdir.mkdir(mode=0o700)
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=root_fd, follow_symlinks=False):
        here = Path(dirpath)
        for name in dirnames + filenames:
            relative = here / name
            shown = relative.as_posix()
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            dst = workdir / relative
            if stat.S_ISLNK(st.st_mode):
                target = (opened / relative).resolve()
                if target != opened and opened not in target.parents:
                    raise SourceError(f"{shown}: symlink points outside the source directory")
                budget.take(files=1)
                os.symlink(os.readlink(name, dir_fd=dir_fd), dst)
            elif stat.S_ISDIR(st.st_mode):
                dst.mkdir(mode=0o700)
                modes.append((dst, stat.S_IMODE(st.st_mode) & 0o777))
            elif stat.S_ISREG(st.st_mode):
                budget.take(files=1)
                _copy_file(name, dir_fd, dst, root.st_uid, shown, budget)
            else:
                raise SourceError(f"{shown}: not a regular file")
    for path, mode in reversed(modes):  # deepest first, so a read-only directory is filled first
        path.chmod(mode)
    workdir.chmod(stat.S_IMODE(root.st_mode) & 0o777)


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
        return self.check_real(Path(os.path.realpath(src)), source_path)

    def check_real(self, real: Path, source_path: str) -> Path:
        """`real` (a path without links) may be a source, as `source_path` names it."""
        for forbidden in self.forbidden:
            guarded = Path(os.path.realpath(forbidden))
            if real == guarded or guarded in real.parents or real in guarded.parents:
                raise SourceError(
                    f"source path {_short(source_path)} is or holds a directory of the platform's "
                    "state or of the machine's secrets; it is never a source"
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
            _copy_source(source_path, policy or SourcePolicy(), workdir)
        else:
            _write_inline(workdir, inline or [])
    except SourceError:
        remove(workdir)
        raise
    except OSError as exc:
        remove(workdir)
        raise SourceError(f"cannot prepare the workspace: {exc.strerror or exc}") from exc
    return workdir


def _copy_source(source_path: str, policy: SourcePolicy, workdir: Path) -> None:
    """Copy the directory `source_path` names, as `policy` allows, to `workdir`. The policy is
    checked by name first, then again on the directory actually opened (its path as the kernel
    has it for the descriptor): a component swapped for a link between the two cannot lead the
    copy, which root makes, into a directory the policy forbids."""
    root_fd, opened = open_source(policy.check(source_path), policy, source_path)
    try:
        _copy_tree(root_fd, opened, workdir)
    finally:
        os.close(root_fd)


def open_source(real: Path, policy: SourcePolicy, source_path: str) -> tuple[int, Path]:
    """The directory at `real` (checked by name), opened, and its path as opened once the policy
    allowed that too; the caller closes the descriptor."""
    try:
        root_fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise SourceError(f"source path {_short(source_path)} is not a readable directory") from exc
    try:
        opened = Path(os.readlink(f"/proc/self/fd/{root_fd}"))
        policy.check_real(opened, source_path)
    except BaseException:
        os.close(root_fd)
        raise
    return root_fd, opened


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
