"""A KRM package directory as a ResourceList's items, and back.

Reading takes every `*.yaml`/`*.yml` file under the directory (hidden files and directories
skipped), every document in it that is a KRM resource (has apiVersion and kind), and records where
it came from in the annotations `config.kubernetes.io/path` and `config.kubernetes.io/index`
(the file relative to the directory, the document's position in it) and their
`internal.config.kubernetes.io/` forms. Writing groups items by those annotations (the internal
form first), orders each file's documents by index, removes the annotations, writes the files
and deletes the package's YAML files that no longer hold anything. A new resource without a path
goes to `<kind>_<name>.yaml`. Paths are checked: relative, inside the directory, YAML.

A package may come from anywhere, so nothing in it is followed out of it: a symbolic link (to a
file or a directory) or any other file that is not a regular one is skipped when reading and
reported (a link to `~/.kube/config` would otherwise hand its credentials to the function), is
never pruned, and is never written through (a resource whose path is one, or lies under a linked
directory, is refused). Files are opened without following links and read up to the package's
bound, so a FIFO or an endless file cannot hold the command.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kruntimes.krm import errors
from kruntimes.krm.resources import ExpansionTooLarge, YamlError, dump_all, expanded_size, load_all

PATH = "config.kubernetes.io/path"
INDEX = "config.kubernetes.io/index"
INTERNAL_PATH = "internal.config.kubernetes.io/path"
INTERNAL_INDEX = "internal.config.kubernetes.io/index"
ANNOTATIONS = (INTERNAL_PATH, INTERNAL_INDEX, PATH, INDEX)
MAX_FILES = 5000
MAX_PACKAGE_BYTES = 4 * 1024 * 1024
_SAFE = re.compile(r"[^a-z0-9_.-]+")


class PackageError(ValueError):
    """The package cannot be read or written as asked (the message says which file)."""


@dataclass
class Files:
    """A package's YAML files, and what was skipped as not a regular file (relative paths)."""

    regular: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _files(root: Path) -> Files:
    """The package's visible YAML files (os.walk does not enter linked directories; those and
    linked or special files are skipped)."""
    found = Files()
    for directory, subdirs, names in os.walk(root):
        here = Path(directory)
        entered = []
        for d in sorted(subdirs):
            if d.startswith("."):
                continue
            if (here / d).is_symlink():
                found.skipped.append((here / d).relative_to(root).as_posix() + "/")
            else:
                entered.append(d)
        subdirs[:] = entered
        for name in sorted(names):
            if name.startswith(".") or not name.endswith((".yaml", ".yml")):
                continue
            path = here / name
            try:
                regular = stat.S_ISREG(path.lstat().st_mode)
            except OSError:
                regular = False  # gone meanwhile
            if not regular:
                found.skipped.append(path.relative_to(root).as_posix())
                continue
            found.regular.append(path)
            if len(found.regular) > MAX_FILES:
                raise PackageError(f"{root}: more than {MAX_FILES} YAML files")
    return found


def _read_regular(path: Path, limit: int) -> bytes:
    """At most `limit` + 1 bytes of the regular file at `path`, not following a link (a file
    swapped for a link or a FIFO since it was listed fails here rather than being read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, "not a regular file")
        return f.read(limit + 1)


def write_file(path: Path, text: str) -> None:
    """Write `text` to the file at `path` (created or emptied first), never through a link
    there: a link is ELOOP, raised as the OSError it is."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(path, flags, 0o666), "w", encoding="utf-8") as f:
        f.write(text)


def read(root: Path, skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """The KRM resources of the package at `root`, annotated with where each came from; what
    was skipped (links, special files) is added to `skipped` when given. PackageError when it
    cannot be read, errors.InputTooLarge when its aliases expand it past the bound."""
    if not root.is_dir():
        raise PackageError(f"{root} is not a directory")
    items: list[dict[str, Any]] = []
    total = expanded = 0
    files = _files(root)
    if skipped is not None:
        skipped.extend(files.skipped)
    for path in files.regular:
        relative = path.relative_to(root).as_posix()
        try:
            data = _read_regular(path, MAX_PACKAGE_BYTES - total)
        except OSError as e:
            raise PackageError(f"{relative}: cannot read: {e.strerror or e}") from e
        total += len(data)
        if total > MAX_PACKAGE_BYTES:
            raise PackageError(f"{root}: the package is over {MAX_PACKAGE_BYTES} bytes")
        try:
            # aliases count as what they expand to, across the package, before anything is built
            expanded += expanded_size(data, MAX_PACKAGE_BYTES - expanded)
            documents = load_all(data, max_expanded=None)
        except ExpansionTooLarge as e:
            raise errors.InputTooLarge(f"{relative}: {e} (the package's bound)") from e
        except YamlError as e:
            raise PackageError(f"{relative}: {e}") from e
        index = 0
        for document in documents:
            if document is None:
                continue
            if not isinstance(document, dict) or not document.get("apiVersion") or not document.get("kind"):
                raise PackageError(f"{relative}: document {index} is not a KRM resource (apiVersion, kind)")
            metadata = document.setdefault("metadata", {})
            if not isinstance(metadata, dict):
                raise PackageError(f"{relative}: document {index}: metadata is not a mapping")
            annotations = metadata.get("annotations")
            if annotations is None:
                annotations = metadata["annotations"] = {}
            annotations.update(
                {PATH: relative, INDEX: str(index), INTERNAL_PATH: relative, INTERNAL_INDEX: str(index)}
            )
            items.append(document)
            index += 1
    return items


def strip(item: dict[str, Any]) -> tuple[str | None, int]:
    """Remove the location annotations from `item`; the path and index they held."""
    metadata = item.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    if not isinstance(metadata, dict) or not isinstance(annotations, dict):
        return None, 0
    path = annotations.get(INTERNAL_PATH) or annotations.get(PATH)
    index = annotations.get(INTERNAL_INDEX) or annotations.get(INDEX) or 0
    for key in ANNOTATIONS:
        annotations.pop(key, None)
    if not annotations:
        del metadata["annotations"]
        if not metadata:
            del item["metadata"]
    try:
        position = int(index)
    except (TypeError, ValueError):
        position = 0
    return (str(path) if path else None), position


def _default_path(item: dict[str, Any]) -> str:
    name = (item.get("metadata") or {}).get("name") or "resource"
    return _SAFE.sub("-", f"{item.get('kind', 'resource')}_{name}".lower()) + ".yaml"


def _check(root: Path, relative: str) -> Path:
    candidate = Path(relative)
    if candidate.is_absolute() or ".." in candidate.parts or not relative.endswith((".yaml", ".yml")):
        raise PackageError(f"{relative!r}: a resource path must be a relative YAML file inside the package")
    base = root.resolve()
    target = base / candidate
    if not target.resolve().is_relative_to(base):
        raise PackageError(f"{relative!r} leaves the package directory")
    step = base
    for part in candidate.parts:
        step = step / part
        try:
            mode = step.lstat().st_mode
        except FileNotFoundError:
            break  # created by the write, as a directory or a regular file
        except OSError as e:
            raise PackageError(f"{relative!r}: {e.strerror}") from e
        if stat.S_ISLNK(mode):
            link = step.relative_to(base)
            raise PackageError(f"{relative!r}: {link} is a symbolic link; links are not written through")
        if step != target and not stat.S_ISDIR(mode):
            raise PackageError(f"{relative!r}: {step.relative_to(base)} is not a directory")
        if step == target and not stat.S_ISREG(mode):
            raise PackageError(f"{relative!r} is not a regular file")
    return target


def layout(items: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The items by file (relative path), each file's in index order, annotations removed."""
    files: dict[str, list[tuple[int, int, dict[str, Any]]]] = {}
    for order, item in enumerate(items):
        path, index = strip(item)
        files.setdefault(path or _default_path(item), []).append((index, order, item))
    return {
        path: [item for _, _, item in sorted(entries, key=lambda e: (e[0], e[1]))]
        for path, entries in files.items()
    }


def write(root: Path, items: list[dict[str, Any]], *, prune: bool) -> list[str]:
    """Write `items` into the package at `root`; with `prune`, delete its YAML files that no
    longer hold a resource. The relative paths written."""
    files = layout(items)
    targets = {relative: _check(root, relative) for relative in files}
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PackageError(f"{root}: cannot create the directory: {e.strerror}") from e
    for relative, documents in files.items():
        target = targets[relative]
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_file(target, dump_all(documents))
        except OSError as e:
            raise PackageError(f"{relative!r}: cannot write: {e.strerror}") from e
    if prune:
        kept = set(targets.values())
        for path in _files(root).regular:
            if path.resolve() not in kept:
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass  # gone meanwhile
                except OSError as e:
                    raise PackageError(f"{path.relative_to(root)}: cannot remove: {e.strerror}") from e
    return sorted(files)
