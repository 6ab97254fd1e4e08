"""The embedded platform's secret store: what a Run's `envFrom` names, kept beside the platform's
state (`{state dir}/secrets/{namespace}/{secret}/{KEY}`, mode 0700 directories, 0600 files). Hosts
read it when they register a function; functions never see the directory, Temporal never sees
the values (a Run holds only the secret's name). In a cluster the same shape comes from a
Kubernetes Secret mounted as a volume.

    krt secret create db -n default --from-literal PASSWORD=... --from-file CERT=./cert.pem
    krt secret list [-n NS]       krt secret delete NAME [-n NS]

Errors::

    ValueError
     └── SecretError   a name, key or value out of bounds, or no such secret
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from kruntimes.api.limits import MAX_ENV_VALUE_BYTES, MAX_SECRET_BYTES, MAX_SECRET_KEYS
from kruntimes.api.names import validate_dns1123_label, validate_env_name

SECRETS_DIR = "secrets"


class SecretError(ValueError):
    """Messages name secrets and keys, never values."""


def _directory(state_dir: Path, namespace: str, name: str) -> Path:
    try:
        validate_dns1123_label(namespace, field="namespace")
        validate_dns1123_label(name, field="secret")
    except ValueError as exc:
        raise SecretError(str(exc)) from exc
    return state_dir / SECRETS_DIR / namespace / name


def create(state_dir: Path, *, namespace: str, name: str, values: dict[str, bytes]) -> Path:
    """Write the secret (replacing one of that name whole); returns its directory."""
    if not values:
        raise SecretError("a secret needs at least one key")
    if len(values) > MAX_SECRET_KEYS:
        raise SecretError(f"a secret holds at most {MAX_SECRET_KEYS} keys")
    total = 0
    for key, value in values.items():
        try:
            validate_env_name(key)
        except ValueError as exc:
            raise SecretError(f"key {key[:64]!r}: {exc}") from exc
        if len(value) > MAX_ENV_VALUE_BYTES or b"\0" in value:
            raise SecretError(f"key {key}: a value is at most {MAX_ENV_VALUE_BYTES} bytes, without NUL")
        try:
            value.decode()
        except UnicodeDecodeError as exc:
            raise SecretError(f"key {key}: the value is not UTF-8") from exc
        total += len(value)
    if total > MAX_SECRET_BYTES:
        raise SecretError(f"a secret's values are at most {MAX_SECRET_BYTES} bytes together")
    target = _directory(state_dir, namespace, name)
    for parent in (state_dir / SECRETS_DIR, target.parent):
        parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        parent.chmod(0o700)
    staging = target.with_name(f".{name}.new")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o700)
    for key, value in values.items():
        fd = os.open(staging / key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(value)
    old = target.with_name(f".{name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    return target


def names(state_dir: Path, *, namespace: str) -> list[tuple[str, list[str]]]:
    """(secret, its keys) of a namespace, by name."""
    directory = _directory(state_dir, namespace, "x").parent
    if not directory.is_dir():
        return []
    found = []
    for entry in sorted(directory.iterdir()):
        # a linked secret directory is refused when read (config/secret_files.py): not listed either
        if entry.is_dir() and not entry.is_symlink() and not entry.name.startswith("."):
            found.append((entry.name, sorted(p.name for p in entry.iterdir() if not p.name.startswith("."))))
    return found


def delete(state_dir: Path, *, namespace: str, name: str) -> bool:
    target = _directory(state_dir, namespace, name)
    if not target.exists():
        return False
    shutil.rmtree(target)
    return True
