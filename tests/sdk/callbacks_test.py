"""kruntimes.sdk.callbacks.verify, a callback receiver's check of X-Kruntime-Signature: the body,
the key and the time each matter; a malformed header is False, never an error."""

from __future__ import annotations

import pytest

from kruntimes.sdk.callbacks import header, sign, verify

KEY = b"receiver key"
BODY = b'{"invocationId": "inv-1", "state": "Succeeded"}'
T = 1_800_000_000


def test_a_header_of_the_body_key_and_time_verifies() -> None:
    assert verify(header(BODY, KEY, timestamp=T), BODY, KEY, now=T)
    assert verify(header(BODY, KEY, timestamp=T), BODY, KEY, now=T + 300)
    assert verify(header(BODY, KEY, timestamp=T), BODY, KEY, now=T - 300)


@pytest.mark.parametrize(
    ("body", "key", "now"),
    [
        (BODY + b" ", KEY, T),  # another body
        (BODY, b"another key", T),  # another key
        (BODY, KEY, T + 301),  # replayed past the tolerance
        (BODY, KEY, T - 301),  # from too far in the future
        (BODY, b"", T),  # no key
    ],
)
def test_another_body_key_or_a_time_past_the_tolerance_does_not_verify(
    body: bytes, key: bytes, now: int
) -> None:
    assert not verify(header(BODY, KEY, timestamp=T), body, key, now=now)


def test_the_timestamp_is_signed_with_the_body() -> None:
    moved = f"t={T + 100},v1={sign(BODY, KEY, timestamp=T)}"
    assert not verify(moved, BODY, KEY, now=T + 100)


def test_any_v1_of_the_header_may_match_and_the_tolerance_is_the_callers() -> None:
    both = f"t={T},v1={sign(BODY, b'old key', timestamp=T)},v1={sign(BODY, KEY, timestamp=T)}"
    assert verify(both, BODY, KEY, now=T)
    assert verify(both, BODY, b"old key", now=T)
    assert verify(header(BODY, KEY, timestamp=T), BODY, KEY, now=T + 3600, tolerance_s=3600)


@pytest.mark.parametrize(
    "malformed",
    [
        "",
        "v1=" + "0" * 64,
        f"t={T}",
        f"t=abc,v1={sign(BODY, KEY, timestamp=T)}",
        f"t={T},t={T},v1={sign(BODY, KEY, timestamp=T)}",
        f"t={T};v1={sign(BODY, KEY, timestamp=T)}",
        f"t={T},v1=é",
        f"t={T},v1={sign(BODY, KEY, timestamp=T)}," + "x" * 2000,
    ],
)
def test_a_malformed_header_does_not_verify(malformed: str) -> None:
    assert not verify(malformed, BODY, KEY, now=T)
