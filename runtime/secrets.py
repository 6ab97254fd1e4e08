"""Where a host finds the secrets a Run's `envFrom` names: a directory per namespace and secret,
one file per key (`{root}/{namespace}/{secret}/{KEY}`, the shape of a Kubernetes Secret mounted
as a volume). Functions never see this directory (it lies in the state directory, which their
mount namespace hides); they get only the values, as environment variables of their own.

Names are validated before they touch a path; files are read without following symlinks, within
the bounds of kruntimes.api.limits.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from kruntimes.api.limits import MAX_ENV_VALUE_BYTES, MAX_SECRET_BYTES, MAX_SECRET_KEYS
from kruntimes.api.names import validate_dns1123_label, validate_env_name
from kruntimes.runtime.errors import InvalidRequest, SecretNotFound


class FileSecrets:
    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, namespace: str, name: str) -> dict[str, str]:
        """Every key of the secret `name` of `namespace`; SecretNotFound when there is none."""
        try:
            validate_dns1123_label(namespace or "default", field="namespace")
            validate_dns1123_label(name, field="secret")
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from exc
        directory = self.root / (namespace or "default") / name
        try:
            entries = sorted(e for e in os.listdir(directory) if not e.startswith("."))
        except OSError as exc:
            raise SecretNotFound(f"no secret {name!r} in namespace {namespace or 'default'!r}") from exc
        if len(entries) > MAX_SECRET_KEYS:
            raise InvalidRequest(f"secret {name!r} has more than {MAX_SECRET_KEYS} keys")
        values: dict[str, str] = {}
        total = 0
        for key in entries:
            try:
                validate_env_name(key)
            except ValueError as exc:
                raise InvalidRequest(f"secret {name!r}: key {key[:64]!r} is not an environment name") from exc
            value = _read_value(directory / key)
            total += len(value)
            if len(value) > MAX_ENV_VALUE_BYTES or total > MAX_SECRET_BYTES:
                raise InvalidRequest(f"secret {name!r}: values larger than the bounds")
            try:
                values[key] = value.decode()
            except UnicodeDecodeError as exc:
                raise InvalidRequest(f"secret {name!r}: key {key!r} is not UTF-8") from exc
            if "\x00" in values[key]:
                raise InvalidRequest(f"secret {name!r}: key {key!r} holds a NUL")
        return values


def _read_value(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InvalidRequest(f"secret file {path.name!r} is a symlink") from exc
        raise SecretNotFound(f"secret file {path.name!r} cannot be read") from exc
    with os.fdopen(fd, "rb") as f:
        return f.read(MAX_ENV_VALUE_BYTES + 1)
