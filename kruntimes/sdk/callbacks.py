"""The signature of an async invocation's callback (docs/async-invocations.md, "Callbacks"), for
the worker that signs it and the receiver that checks it:

    X-Kruntime-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">

keyed by the bytes of the target's callback Secret. The timestamp is signed with the body, so a
receiver that checks it within a tolerance refuses a delivery replayed later.

    from kruntimes.sdk.callbacks import SIGNATURE_HEADER, verify
    if not verify(request.headers.get(SIGNATURE_HEADER, ""), body, key):
        return 401

Pure functions of the standard library: a receiver needs nothing else of kruntimes.
"""

from __future__ import annotations

import hashlib
import hmac
import time

__all__ = ["SIGNATURE_HEADER", "header", "sign", "verify"]

SIGNATURE_HEADER = "X-Kruntime-Signature"
DEFAULT_TOLERANCE_S = 300
MAX_HEADER_CHARS = 1024  # a header longer than any the worker sends is refused unread
_SCHEME = "v1"


def sign(body: bytes, key: bytes, *, timestamp: int) -> str:
    """The hex HMAC-SHA256 of `<timestamp>.<body>` under `key`."""
    return hmac.new(key, str(timestamp).encode("ascii") + b"." + body, hashlib.sha256).hexdigest()


def header(body: bytes, key: bytes, *, timestamp: int) -> str:
    """The X-Kruntime-Signature value of `body` sent at `timestamp` (unix seconds)."""
    return f"t={timestamp},{_SCHEME}={sign(body, key, timestamp=timestamp)}"


def verify(
    signature_header: str,
    body: bytes,
    key: bytes,
    *,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    now: float | None = None,
) -> bool:
    """Whether `signature_header` signs `body` under `key` at a time within `tolerance_s` of
    `now` (default: the clock). Compared in constant time; any `v1=` of the header may match
    (a sender changing keys may send one per key); a malformed header is False, never an error."""
    if not key or not signature_header or len(signature_header) > MAX_HEADER_CHARS:
        return False
    timestamp: int | None = None
    signatures: list[str] = []
    for part in signature_header.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            return False
        if name == "t":
            if timestamp is not None or not value.isascii() or not value.isdigit() or len(value) > 12:
                return False
            timestamp = int(value)
        elif name == _SCHEME:
            signatures.append(value)
    if timestamp is None or not signatures:
        return False
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        return False
    expected = sign(body, key, timestamp=timestamp).encode("ascii")
    matched = False
    for candidate in signatures:
        # every candidate compared, so the time taken says nothing about which one matched
        matched |= hmac.compare_digest(expected, candidate.encode("ascii", "replace"))
    return matched
