"""The payload codec's keys and its AES-256-GCM sealing, without the Temporal SDK.

kruntimes.temporal.codec's EncryptionCodec seals each payload with these for the SDK's clients and
workers; the gateway, which never loads the SDK (tests/contracts/gateway_sdk_test.py), seals and
opens the payloads it writes to and reads from Temporal itself (an async invocation's input and
memos, gateway/visibility.py) with the same keys, so both sides read each other's payloads.

A sealed payload is the serialized `temporal.api.common.v1.Payload`, encrypted with the active
key under a random nonce (`nonce + ciphertext`, AAD), with the metadata
`{"encoding": ENCODING, KEY_ID: <key id>}`.
"""

from __future__ import annotations

import base64
import os
import re
import secrets
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

ENCODING = b"binary/encrypted"
KEY_ID = "encryption-key-id"
KEY_BYTES = 32
NONCE_BYTES = 12
AAD = b"kruntimes/v1"
MAX_KEYS = 64
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class CodecError(ValueError):
    """The key directory cannot be used, or a payload does not decrypt (messages name key ids,
    never key material)."""


@dataclass(frozen=True)
class Keyring:
    keys: dict[str, bytes]  # id → key

    @property
    def active(self) -> str:
        return max(self.keys)

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Keyring:
        path = Path(directory)
        try:
            entries = sorted(p for p in path.iterdir() if not p.name.startswith("."))
        except OSError as exc:
            raise CodecError(f"codec key directory {path}: {exc.strerror or exc}") from exc
        keys: dict[str, bytes] = {}
        for entry in entries[: MAX_KEYS + 1]:
            if not _KEY_ID.fullmatch(entry.name) or not entry.is_file():
                continue
            st = entry.stat()
            if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO) and not _mounted_secret(entry):
                raise CodecError(f"codec key {entry}: readable by others (make it mode 0600)")
            try:
                key = base64.b64decode(entry.read_bytes().strip(), validate=True)
            except (ValueError, OSError) as exc:
                raise CodecError(f"codec key {entry.name}: not base64") from exc
            if len(key) != KEY_BYTES:
                raise CodecError(f"codec key {entry.name}: {len(key)} bytes, not {KEY_BYTES}")
            keys[entry.name] = key
        if not keys:
            raise CodecError(f"codec key directory {path} holds no key")
        if len(keys) > MAX_KEYS:
            raise CodecError(f"codec key directory {path} holds more than {MAX_KEYS} keys")
        return cls(keys)


def _mounted_secret(entry: Path) -> bool:
    """A Kubernetes Secret volume shows its files as symlinks into `..data`, mode set by the pod
    spec; the directory, not the file mode, protects it there."""
    return entry.is_symlink() and "..data" in os.readlink(entry)


def new_key_id(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")


def ensure_key(directory: str | os.PathLike[str]) -> Path:
    """Create the key directory with a first key unless it holds one (embedded mode)."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if any(_KEY_ID.fullmatch(p.name) for p in path.iterdir()):
        return path
    add_key(path)
    return path


def add_key(directory: str | os.PathLike[str], *, key_id: str | None = None) -> str:
    """Write a new random key (it becomes the active one if its id is the greatest)."""
    ident = key_id or new_key_id()
    if not _KEY_ID.fullmatch(ident):
        raise CodecError(f"key id {ident!r} must match {_KEY_ID.pattern}")
    target = Path(directory) / ident
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64encode(secrets.token_bytes(KEY_BYTES)) + b"\n")
    return ident


class Sealer:
    """Seals with the keyring's active key; opens with any of its keys."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring
        self._ciphers = {ident: AESGCM(key) for ident, key in keyring.keys.items()}
        self.active = keyring.active

    def seal(self, plain: bytes) -> tuple[dict[str, bytes], bytes]:
        """The sealed payload's metadata and data for `plain` (a serialized Payload)."""
        nonce = secrets.token_bytes(NONCE_BYTES)
        sealed = self._ciphers[self.active].encrypt(nonce, plain, AAD)
        return {"encoding": ENCODING, KEY_ID: self.active.encode()}, nonce + sealed

    def open(self, key_id: bytes, data: bytes) -> bytes:
        """The serialized Payload sealed in `data` with the key `key_id`; CodecError otherwise."""
        ident = key_id.decode(errors="replace")
        cipher = self._ciphers.get(ident)
        if cipher is None:
            raise CodecError(f"payload encrypted with key {ident!r:.80}, which is not in the keyring")
        try:
            return cipher.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], AAD)
        except InvalidTag as exc:
            raise CodecError(f"payload does not decrypt with key {ident!r}") from exc
