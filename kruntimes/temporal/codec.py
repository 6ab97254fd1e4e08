"""Payloads in Temporal history encrypted with AES-256-GCM (a Temporal `PayloadCodec`).

Run specs (env included), outputs and every other workflow and activity payload are encrypted
by each client and worker before they reach Temporal, so `temporal workflow show` and the
database hold ciphertext. Search attributes are indexes and stay plain: never put a secret there.

Keys live in a directory, one file per key: the file name is the key id
(`[A-Za-z0-9._-]{1,64}`), the content the 32-byte key in base64 (a Kubernetes Secret mounted as
a volume has exactly this shape). The newest key — the greatest id, so name keys by date —
encrypts; every key decrypts, so rotation is: add a key, restart, and drop an old key only once
no history that uses it is kept. A payload names its key id in its metadata.

Errors::

    ValueError
     └── CodecError   a key directory is unusable, or a payload cannot be decrypted

A failure's message and stack trace are encrypted too (kruntimes.temporal.connect's failure
converter), except a `PlainFailure`'s: the platform's own words, raised by workflow code.
"""

from __future__ import annotations

import base64
import os
import re
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec
from temporalio.exceptions import ApplicationError

ENCODING = b"binary/encrypted"
KEY_ID = "encryption-key-id"
KEY_BYTES = 32
NONCE_BYTES = 12
AAD = b"kruntimes/v1"
# A payload the converter marked as text for operators (a workflow's, activity's or timer's
# summary: kruntimes.wire.summaries.Plain) is stored unencrypted, so the Temporal UI and CLI show
# it without the codec server. Only the converter sets the mark, and only for that type; the
# codec takes it off, so the stored payload is an ordinary `json/plain` one (the `temporal` CLI
# shows a payload as its text only when its metadata holds nothing but the encoding). Decoding a
# payload that is not encrypted returns it as it is either way.
PLAIN = "krt-plain"
MAX_KEYS = 64
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class PlainFailure(ApplicationError):
    """A failure whose message is the platform's own words (a Run's reason, host and attempt:
    never a handler's text), stored unencrypted so that the Temporal UI and `temporal workflow
    describe` say why without the codec server; its details are payloads, encrypted as any.
    kruntimes.temporal.connect's failure converter leaves it plain."""


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


class EncryptionCodec(PayloadCodec):
    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring
        self._ciphers = {ident: AESGCM(key) for ident, key in keyring.keys.items()}
        self._active = keyring.active

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.encrypt(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.decrypt(p) for p in payloads]

    def encrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get(PLAIN) == b"1":
            metadata = {k: v for k, v in payload.metadata.items() if k != PLAIN}
            return Payload(metadata=metadata, data=payload.data)
        nonce = secrets.token_bytes(NONCE_BYTES)
        sealed = self._ciphers[self._active].encrypt(nonce, payload.SerializeToString(), AAD)
        return Payload(
            metadata={"encoding": ENCODING, KEY_ID: self._active.encode()},
            data=nonce + sealed,
        )

    def decrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload  # written before the codec was turned on: readable as it is
        ident = payload.metadata.get(KEY_ID, b"").decode(errors="replace")
        cipher = self._ciphers.get(ident)
        if cipher is None:
            raise CodecError(f"payload encrypted with key {ident!r:.80}, which is not in the keyring")
        data = payload.data
        try:
            plain = cipher.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], AAD)
        except InvalidTag as exc:
            raise CodecError(f"payload does not decrypt with key {ident!r}") from exc
        return Payload.FromString(plain)
