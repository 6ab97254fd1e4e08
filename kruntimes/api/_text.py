"""Byte-length and character checks shared by the validators."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
ELLIPSIS = "…"


def utf8_len(value: str, *, field: str) -> int:
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise ValueError(f"{field}: is not valid UTF-8 text (lone surrogate)") from e


def has_control_chars(value: str) -> bool:
    """True when value holds a C0 control, DEL or a C1 control character."""
    return _CONTROL.search(value) is not None


def truncate_utf8(value: str, *, max_bytes: int) -> str:
    """Cut value to at most max_bytes of UTF-8, on a character boundary, marking the cut with "…".

    Lone surrogates are replaced so the result always encodes. Idempotent.
    """
    data = value.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return data.decode("utf-8")
    budget = max_bytes - len(ELLIPSIS.encode("utf-8"))
    return data[:budget].decode("utf-8", "ignore") + ELLIPSIS
