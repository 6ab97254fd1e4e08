from __future__ import annotations

import base64

import pytest

from kruntimes.gateway.auth import token_expiry
from tests.gateway_auth.helpers import issue, jwt


def test_the_exp_claim_of_a_jwt_is_read_without_verification() -> None:
    assert token_expiry(jwt(sub="alice", exp=1_900_000_000)) == 1_900_000_000.0
    assert token_expiry(jwt(sub="alice", exp=1_900_000_000.5)) == 1_900_000_000.5


@pytest.mark.parametrize(
    "token",
    [
        issue(),
        jwt(sub="alice"),
        jwt(sub="alice", exp="tomorrow"),
        jwt(sub="alice", exp=True),
        jwt(sub="alice", exp=10**400),
        "a.b",
        "a..c",
        "a.!!!!.c",
        "a.bm90IGpzb24.c",
        "a." + "W" * 40 + ".c",
    ],
    ids=[
        "opaque",
        "no-exp",
        "exp-not-a-number",
        "exp-boolean",
        "exp-overflows",
        "two-segments",
        "empty-segment",
        "not-base64",
        "not-json",
        "garbage",
    ],
)
def test_anything_else_has_no_known_expiry(token: str) -> None:
    assert token_expiry(token) is None


def test_a_deeply_nested_payload_has_no_known_expiry() -> None:
    payload = base64.urlsafe_b64encode(b"[" * 5000).rstrip(b"=").decode()
    assert token_expiry(f"a.{payload}.c") is None
