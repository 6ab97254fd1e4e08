"""Where a host finds the secrets a Run's `envFrom` names: a directory per namespace and secret,
one file per key (`{root}/{namespace}/{secret}/{KEY}`, the shape of a Kubernetes Secret mounted
as a volume). Functions never see this directory (it lies in the state directory, which their
mount namespace hides); they get only the values, as environment variables of their own.

Names are validated before they touch a path; the namespace's and the secret's directories are
opened without following symlinks. A key may be a link that stays inside its secret's directory
(a Kubernetes Secret volume is `KEY -> ..data/KEY`, `..data -> ..2024_01_01...`); a link that
leaves it, absolute or through `..`, is refused. Values are read within kruntimes.api.limits.

Read by a host for a Run's `envFrom`, and by the worker for the Secret that signs an async
invocation's callback (activities/callbacks.py); each maps these errors to its own::

    SecretFileError
     ├── SecretNotFound   no such namespace, secret or key file
     └── SecretInvalid    a name, key, value or link out of bounds
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from kruntimes.api.limits import MAX_ENV_VALUE_BYTES, MAX_SECRET_BYTES, MAX_SECRET_KEYS
from kruntimes.api.names import validate_dns1123_label, validate_env_name


class SecretFileError(Exception):
    """Messages name the namespace, the secret and the key, never a value or a path above them."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SecretNotFound(SecretFileError):
    pass


class SecretInvalid(SecretFileError):
    pass


class FileSecrets:
    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, namespace: str, name: str) -> dict[str, str]:
        """Every key of the secret `name` of `namespace`; SecretNotFound when there is none."""
        try:
            validate_dns1123_label(namespace or "default", field="namespace")
            validate_dns1123_label(name, field="secret")
        except ValueError as exc:
            raise SecretInvalid(str(exc)) from exc
        try:
            directory = _open_secret_directory(self.root, namespace or "default", name)
        except FileNotFoundError as exc:
            raise SecretNotFound(f"no secret {name!r} in namespace {namespace or 'default'!r}") from exc
        try:
            return _read_secret(directory, name)
        finally:
            os.close(directory)


def _read_secret(directory: int, name: str) -> dict[str, str]:
    entries = sorted(e for e in os.listdir(directory) if not e.startswith("."))
    if len(entries) > MAX_SECRET_KEYS:
        raise SecretInvalid(f"secret {name!r} has more than {MAX_SECRET_KEYS} keys")
    values: dict[str, str] = {}
    total = 0
    for key in entries:
        try:
            validate_env_name(key)
        except ValueError as exc:
            raise SecretInvalid(f"secret {name!r}: key {key[:64]!r} is not an environment name") from exc
        value = _read_value(directory, key)
        total += len(value)
        if len(value) > MAX_ENV_VALUE_BYTES or total > MAX_SECRET_BYTES:
            raise SecretInvalid(f"secret {name!r}: values larger than the bounds")
        try:
            values[key] = value.decode()
        except UnicodeDecodeError as exc:
            raise SecretInvalid(f"secret {name!r}: key {key!r} is not UTF-8") from exc
        if "\x00" in values[key]:
            raise SecretInvalid(f"secret {name!r}: key {key!r} holds a NUL")
    return values


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# a Secret volume needs two hops (KEY -> ..data/KEY, ..data -> ..timestamp); a few to spare
_MAX_LINKS = 8


def _open_secret_directory(root: Path, namespace: str, name: str) -> int:
    """The secret's directory, reached without following a link: a namespace or a secret that is
    a symlink (to another namespace's secret, say) is refused, not followed."""
    try:
        parent = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise FileNotFoundError(root) from exc
    try:
        for what, part in (("namespace", namespace), ("secret", name)):
            try:
                child = os.open(part, _DIRECTORY, dir_fd=parent)
            except OSError as exc:
                if _is_link(parent, part):
                    raise SecretInvalid(f"{what} directory {part!r} is a symlink") from exc
                raise FileNotFoundError(part) from exc
            os.close(parent)
            parent = child
        return parent
    except BaseException:
        os.close(parent)
        raise


def _is_link(directory: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _read_value(directory: int, key: str) -> bytes:
    fd = _open_beneath(directory, key)
    with os.fdopen(fd, "rb") as f:
        return f.read(MAX_ENV_VALUE_BYTES + 1)


def _open_beneath(base: int, key: str) -> int:
    """Open `key` of the directory `base`, following only links that stay beneath `base`; each
    component is opened without following links, so a link swapped in meanwhile is refused."""
    pending = [key]
    trail: list[int] = []  # directory fds beneath base, innermost last
    links = 0
    try:
        while pending:
            part = pending.pop(0)
            here = trail[-1] if trail else base
            if part in ("", "."):
                continue
            if part == "..":
                if not trail:
                    raise SecretInvalid(f"secret file {key!r} is a symlink out of its secret")
                os.close(trail.pop())
                continue
            try:
                st = os.stat(part, dir_fd=here, follow_symlinks=False)
            except OSError as exc:
                raise SecretNotFound(f"secret file {key!r} cannot be read") from exc
            if stat.S_ISLNK(st.st_mode):
                links += 1
                target = os.readlink(part, dir_fd=here)
                if os.path.isabs(target) or links > _MAX_LINKS:
                    raise SecretInvalid(f"secret file {key!r} is a symlink out of its secret")
                pending[:0] = target.split("/")
                continue
            last = not pending
            try:
                fd = os.open(
                    part,
                    (os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK) if last else _DIRECTORY,
                    dir_fd=here,
                )
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise SecretInvalid(f"secret file {key!r} changed into a symlink while read") from exc
                raise SecretNotFound(f"secret file {key!r} cannot be read") from exc
            if not last:
                trail.append(fd)
                continue
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise SecretInvalid(f"secret file {key!r} is not a regular file")
            return fd
        raise SecretInvalid(f"secret file {key!r} names a directory")
    finally:
        for fd in trail:
            os.close(fd)
