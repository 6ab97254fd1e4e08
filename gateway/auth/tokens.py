"""The embedded mode's static token file, one caller per line: `token,user,uid,"group1,group2"`
(the format is kruntimes.wire.tokens).

The file must be readable by its owner only (0600 or 0400); it is checked for changes at most once
a second on lookup and reloaded, and a reload that fails keeps the table loaded before. No message
or log line ever contains a token: problems are reported by file, mode and line number.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kruntimes.gateway.auth.base import Principal, Unauthenticated, check_token
from kruntimes.wire import tokens as token_format
from kruntimes.wire.tokens import TokenEntry, TokenFormatError

log = logging.getLogger(__name__)

MAX_FILE_BYTES = token_format.MAX_FILE_BYTES
MAX_ENTRIES = 10_000
RECHECK_INTERVAL_S = 1.0

# (st_dev, st_ino, st_mtime_ns, st_size, st_mode): a change in any of them means "read it again";
# the mode is included so that fixing a rejected file's permissions is noticed too.
_Signature = tuple[int, int, int, int, int]


class TokenFileError(ValueError):
    """The token file cannot be used; the message names the file and the line, never a token."""


@dataclass(frozen=True)
class _Table:
    signature: _Signature
    entries: tuple[tuple[bytes, Principal], ...]  # (sha256 of the token, who it is)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def _signature(st: os.stat_result) -> _Signature:
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode)


def _read(path: Path, *, max_bytes: int) -> tuple[_Signature, bytes]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise TokenFileError(f"token file {path}: cannot open ({e.strerror})") from e
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise TokenFileError(f"token file {path}: not a regular file")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise TokenFileError(
                f"token file {path} has mode {mode:04o}: "
                "it must not be accessible to group or others (use 0600)"
            )
        if st.st_size > max_bytes:
            raise TokenFileError(f"token file {path} is larger than {max_bytes} bytes")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise TokenFileError(f"token file {path} is larger than {max_bytes} bytes")
    return _signature(st), data


def _entries(path: Path, data: bytes) -> Iterator[tuple[int, TokenEntry]]:
    """The file's entries with their line numbers; a malformed line is a TokenFileError."""
    try:
        yield from token_format.entries(token_format.decode(data))
    except TokenFormatError as e:
        raise TokenFileError(f"token file {path}: {e}") from None


def _parse(path: Path, data: bytes, *, max_entries: int) -> list[tuple[bytes, Principal]]:
    entries: list[tuple[bytes, Principal]] = []
    first_line: dict[bytes, int] = {}
    for lineno, entry in _entries(path, data):
        try:
            check_token(entry.token)
        except Unauthenticated:
            raise TokenFileError(
                f"token file {path}: line {lineno} has an empty token, or one longer than 8 KiB "
                "or with whitespace, control or non-ASCII characters"
            ) from None
        if not entry.user:
            raise TokenFileError(f"token file {path}: line {lineno} has an empty user")
        digest = _digest(entry.token)
        if digest in first_line:
            raise TokenFileError(
                f"token file {path}: lines {first_line[digest]} and {lineno} have the same token"
            )
        first_line[digest] = lineno
        entries.append((digest, Principal(user=entry.user, uid=entry.uid, groups=entry.groups)))
        if len(entries) > max_entries:
            raise TokenFileError(f"token file {path} has more than {max_entries} tokens")
    return entries


def _load(path: Path, *, max_bytes: int, max_entries: int) -> _Table:
    signature, data = _read(path, max_bytes=max_bytes)
    return _Table(signature=signature, entries=tuple(_parse(path, data, max_entries=max_entries)))


class TokenFile:
    """Who a static token belongs to. Raises TokenFileError (a ValueError) if the file is unusable."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.monotonic,
        max_bytes: int = MAX_FILE_BYTES,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        self._path = Path(path)
        self._clock = clock
        self._max_bytes = max_bytes
        self._max_entries = max_entries
        self._table = _load(self._path, max_bytes=max_bytes, max_entries=max_entries)
        self._checked_at = clock()
        self._failure: object = None  # the last reload problem reported, so it is logged once

    @property
    def path(self) -> Path:
        return self._path

    def __len__(self) -> int:
        return len(self._table.entries)

    def principal(self, token: str) -> Principal | None:
        """Who `token` belongs to, or None. Compares against every entry, in time independent of the match."""
        self._maybe_reload()
        digest = _digest(token)
        found: Principal | None = None
        for entry_digest, principal in self._table.entries:
            if hmac.compare_digest(entry_digest, digest):
                found = principal
        return found

    def _maybe_reload(self) -> None:
        now = self._clock()
        if now - self._checked_at < RECHECK_INTERVAL_S:
            return
        self._checked_at = now
        try:
            signature = _signature(os.stat(self._path))
        except OSError as e:
            self._report(("stat", e.errno), f"token file {self._path}: cannot stat ({e.strerror})")
            return
        if signature == self._table.signature or signature == self._failure:
            return
        try:
            table = _load(self._path, max_bytes=self._max_bytes, max_entries=self._max_entries)
        except TokenFileError as e:
            self._report(signature, str(e))
            return
        self._table = table
        self._failure = None
        log.info("token file %s reloaded: %d tokens", self._path, len(table.entries))

    def _report(self, failure: object, problem: str) -> None:
        if failure != self._failure:
            log.warning("%s; keeping the %d tokens loaded before", problem, len(self._table.entries))
        self._failure = failure
