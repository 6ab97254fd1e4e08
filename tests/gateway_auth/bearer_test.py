from __future__ import annotations

import pytest

from kruntimes.gateway.auth import AuthUnavailable, Forbidden, Unauthenticated, bearer_token
from tests.gateway_auth.helpers import issue


def test_bearer_token_is_taken_from_the_header_whatever_the_scheme_case() -> None:
    token = issue()
    assert bearer_token(f"Bearer {token}") == token
    assert bearer_token(f"bearer {token}") == token
    assert bearer_token(f"BEARER {token}") == token


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "   ",
        "Bearer",
        "Bearer ",
        "Basic dXNlcjpwYXNz",
        "Token abc",
        "Bearer abc def",
        "Bearer  abc",
        "Bearer abc\tdef",
        "Bearer abc\x00def",
        "Bearer abc\x7f",
        "Bearer abcé",
        "Bearer " + "a" * (8 * 1024 + 1),
    ],
    ids=[
        "absent",
        "empty",
        "blank",
        "scheme-only",
        "empty-token",
        "basic-scheme",
        "other-scheme",
        "inner-space",
        "double-space",
        "tab",
        "nul",
        "del",
        "non-ascii",
        "over-8KiB",
    ],
)
def test_missing_or_malformed_bearer_tokens_are_unauthenticated(header: str | None) -> None:
    with pytest.raises(Unauthenticated) as caught:
        bearer_token(header)
    assert caught.value.status == 401
    assert caught.value.reason == "Unauthenticated"


def test_a_token_of_exactly_8_kib_is_accepted() -> None:
    token = "a" * 8 * 1024
    assert bearer_token(f"Bearer {token}") == token


def test_rejections_never_repeat_the_token() -> None:
    token = issue()
    with pytest.raises(Unauthenticated) as caught:
        bearer_token(f"Basic {token}")
    assert token not in str(caught.value)
    with pytest.raises(Unauthenticated) as caught:
        bearer_token(f"Bearer {token} {token}")
    assert token not in str(caught.value)


def test_errors_carry_stable_reasons_and_statuses() -> None:
    assert (Unauthenticated.status, Unauthenticated.reason) == (401, "Unauthenticated")
    assert (Forbidden.status, Forbidden.reason) == (403, "Forbidden")
    assert (AuthUnavailable.status, AuthUnavailable.reason) == (503, "AuthorizationUnavailable")
