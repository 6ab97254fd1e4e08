"""Logging in to the embedded platform's Temporal UI: `krt ui` mints a one-time ticket with the
login key of the client config (0600), and the front (gateway/ui_front.py) redeems it for a
session cookie. A ticket seen by another local user (in a process list, while a browser is being
opened with it) is worth nothing once used, and nothing after TICKET_TTL_S anyway.

    new_key()            a login key (`krt up` keeps it in the state directory and client.json)
    mint(key)            a ticket: nonce.expires.mac (HMAC-SHA256 of both with the key)
    Tickets(key)         redeem(ticket): valid, not expired, never redeemed before
    Sessions             the sessions tickets were redeemed for: random ids, bounded in number
                         and in life
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections import OrderedDict

CODEC_PATH = "/codec"  # where the front serves the codec endpoint, beside the UI (same origin)
TICKET_TTL_S = 120
CLOCK_SKEW_S = 5  # a ticket minted by another process may carry an expiry this much later
MAX_TICKET_CHARS = 256
MAX_REDEEMED = 4096  # tickets remembered until they expire; past this many, tickets are refused
SESSION_TTL_S = 12 * 3600
MAX_SESSIONS = 64  # the oldest session ends when a new one would be one too many
_CONTEXT = b"krt-ui-login"


def new_key() -> str:
    return secrets.token_urlsafe(32)


def _mac(key: str, nonce: str, expires: int) -> str:
    message = b"\0".join((_CONTEXT, nonce.encode(), str(expires).encode()))
    digest = hmac.new(key.encode(), message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def mint(key: str, *, now: float | None = None) -> str:
    nonce = secrets.token_urlsafe(16)
    expires = int((time.time() if now is None else now) + TICKET_TTL_S)
    return f"{nonce}.{expires}.{_mac(key, nonce, expires)}"


class Tickets:
    """The tickets of one login key, each redeemable once."""

    def __init__(self, key: str) -> None:
        self._key = key
        self._redeemed: dict[str, int] = {}  # nonce -> expiry

    def redeem(self, ticket: str, *, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        parts = ticket.split(".") if len(ticket) <= MAX_TICKET_CHARS else []
        if len(parts) != 3 or not parts[1].isascii() or not parts[1].isdigit():
            return False
        nonce, expires = parts[0], int(parts[1])
        if not now <= expires <= now + TICKET_TTL_S + CLOCK_SKEW_S:
            return False
        if not hmac.compare_digest(parts[2], _mac(self._key, nonce, expires)):
            return False
        self._redeemed = {n: e for n, e in self._redeemed.items() if e >= now}
        if nonce in self._redeemed or len(self._redeemed) >= MAX_REDEEMED:
            return False
        self._redeemed[nonce] = expires
        return True


class Sessions:
    """Session ids handed out as cookies, each valid SESSION_TTL_S; at most MAX_SESSIONS."""

    def __init__(self, *, ttl_s: float = SESSION_TTL_S, max_sessions: int = MAX_SESSIONS) -> None:
        self._ttl_s = ttl_s
        self._max = max_sessions
        self._ends: OrderedDict[str, float] = OrderedDict()  # digest of the id -> end (monotonic)

    @staticmethod
    def _digest(session: str) -> str:
        return hashlib.sha256(session.encode("utf-8", "surrogatepass")).hexdigest()

    def new(self) -> str:
        session = secrets.token_urlsafe(32)
        self._ends[self._digest(session)] = time.monotonic() + self._ttl_s
        while len(self._ends) > self._max:
            self._ends.popitem(last=False)
        return session

    def valid(self, session: str | None) -> bool:
        if not session or len(session) > MAX_TICKET_CHARS:
            return False
        end = self._ends.get(self._digest(session))
        if end is None:
            return False
        if end < time.monotonic():
            del self._ends[self._digest(session)]
            return False
        return True
