"""Paths built from identifiers: every part validated as one plain component, the result checked to
stay under its root.

`under(root, *parts)` is the one way a path is made from a Run uid, a host id or any other name
that came from outside: a part is refused if it is empty, `.` or `..`, holds a separator or a NUL,
or is longer than a file name may be; the joined path (symlinks resolved) must be inside `root`.
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_COMPONENT_BYTES = 255  # a file name on Linux


class PathEscape(ValueError):
    """A part is not one plain path component, or the path leaves its root."""


def component(part: str) -> str:
    """`part` if it is one plain path component (see the module docstring), else PathEscape."""
    if not part or part in (".", ".."):
        raise PathEscape(f"path component {part!r:.80} is empty, '.' or '..'")
    if "/" in part or "\\" in part or "\0" in part:
        raise PathEscape(f"path component {part!r:.80} holds a separator or NUL")
    if len(part.encode("utf-8", "surrogateescape")) > MAX_COMPONENT_BYTES:
        raise PathEscape(f"path component {part!r:.80} is longer than {MAX_COMPONENT_BYTES} bytes")
    return part


def under(root: Path, *parts: str) -> Path:
    """`root / part / ...`, each part one plain component, and inside `root` once symlinks are
    resolved (a symlink under root pointing out of it is refused too); else PathEscape."""
    path = root.joinpath(*(component(p) for p in parts))
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise PathEscape(f"{path} is not inside {root}")
    return path
