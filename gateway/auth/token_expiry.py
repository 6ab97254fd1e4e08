"""The `exp` claim of a JWT-shaped bearer token, read without verification.

Only ever used to bound how long a decision about the token may be cached; the token's
validity is the authorizer's business.
"""

from __future__ import annotations

import base64
import binascii
import json
import math


def token_expiry(token: str) -> float | None:
    """Seconds since the epoch at which `token` expires, or None if it is not a JWT with a numeric `exp`."""
    parts = token.split(".")
    if len(parts) != 3 or not all(parts):
        return None
    payload = parts[1]
    try:
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        claims = json.loads(raw)
    except (binascii.Error, ValueError, RecursionError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    if isinstance(exp, bool) or not isinstance(exp, int | float):
        return None
    try:
        seconds = float(exp)
    except OverflowError:
        return None
    return seconds if math.isfinite(seconds) else None
