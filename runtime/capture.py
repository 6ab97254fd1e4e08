"""Bounded capture of a stream: keeps the first `limit` bytes, counts the rest."""

from __future__ import annotations

from kruntimes.api.limits import MAX_LOG_BYTES


class Capture:
    __slots__ = ("_data", "limit", "total")

    def __init__(self, limit: int = MAX_LOG_BYTES) -> None:
        self._data = bytearray()
        self.limit = limit
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.limit - len(self._data)
        if room > 0:
            self._data += chunk[:room]

    @property
    def data(self) -> bytes:
        return bytes(self._data)

    @property
    def truncated(self) -> bool:
        return self.total > len(self._data)

    def tail_text(self, size: int = 1024) -> str:
        return self._data[-size:].decode(errors="replace")
