from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from gateway.auth import Principal, TokenFile, TokenFileError
from tests.gateway_auth.helpers import FakeClock, issue, write_file


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "tokens.csv"


def test_each_line_names_a_user_uid_and_groups(path: Path) -> None:
    alice, bob, carol = issue("alice"), issue("bob"), issue("carol")
    write_file(
        path,
        f'{alice},alice,u-1,"devs,ops"\n{bob},bob,u-2\n{carol},carol,u-3,\n',
    )
    tokens = TokenFile(path)
    assert len(tokens) == 3
    assert tokens.principal(alice) == Principal(user="alice", uid="u-1", groups=("devs", "ops"))
    assert tokens.principal(bob) == Principal(user="bob", uid="u-2", groups=())
    assert tokens.principal(carol) == Principal(user="carol", uid="u-3", groups=())


def test_blank_lines_and_comments_are_ignored(path: Path) -> None:
    alice = issue()
    write_file(path, f"# token,user,uid,groups\n\n   \n  # indented comment\n{alice},alice,u-1,devs\n\n")
    tokens = TokenFile(path)
    assert len(tokens) == 1
    assert tokens.principal(alice) == Principal(user="alice", uid="u-1", groups=("devs",))


def test_unknown_tokens_and_near_misses_match_nobody(path: Path) -> None:
    alice = issue()
    write_file(path, f"{alice},alice,u-1\n")
    tokens = TokenFile(path)
    assert tokens.principal(issue()) is None
    assert tokens.principal(alice[:-1]) is None
    assert tokens.principal(alice + "x") is None
    assert tokens.principal("") is None


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o666, 0o700 | 0o001])
def test_a_file_readable_by_group_or_others_is_refused(path: Path, mode: int) -> None:
    alice = issue()
    write_file(path, f"{alice},alice,u-1\n", mode=mode)
    with pytest.raises(ValueError) as caught:
        TokenFile(path)
    message = str(caught.value)
    assert str(path) in message
    assert f"{mode:04o}" in message
    assert alice not in message


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_file_private_to_its_owner_is_accepted(path: Path, mode: int) -> None:
    write_file(path, f"{issue()},alice,u-1\n", mode=mode)
    assert len(TokenFile(path)) == 1


def test_duplicate_tokens_are_refused_by_line_number_without_the_token(path: Path) -> None:
    shared = issue()
    write_file(path, f"# header\n{shared},alice,u-1\n{issue()},bob,u-2\n{shared},mallory,u-3\n")
    with pytest.raises(TokenFileError) as caught:
        TokenFile(path)
    message = str(caught.value)
    assert "lines 2 and 4" in message
    assert shared not in message
    assert shared not in repr(caught.value)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (",alice,u-1", "empty token"),
        ("{token},,u-1", "empty user"),
        ("{token},alice", "2 columns"),
        ("{token},alice,u-1,devs,extra", "5 columns"),
        ('"{token},alice,u-1', "not valid CSV"),
        ("to ken,alice,u-1", "whitespace"),
    ],
    ids=["empty-token", "empty-user", "too-few-columns", "too-many-columns", "bad-quoting", "inner-space"],
)
def test_malformed_lines_are_refused_by_line_number(path: Path, line: str, problem: str) -> None:
    token = issue()
    write_file(path, f"{issue()},ok,u-0\n" + line.format(token=token) + "\n")
    with pytest.raises(TokenFileError) as caught:
        TokenFile(path)
    message = str(caught.value)
    assert "line 2" in message
    assert problem in message
    assert token not in message


def test_too_many_tokens_are_refused(path: Path) -> None:
    write_file(path, "".join(f"{issue()},user{i},u-{i}\n" for i in range(4)))
    with pytest.raises(TokenFileError, match="more than 3 tokens"):
        TokenFile(path, max_entries=3)


def test_a_file_too_large_is_refused(path: Path) -> None:
    write_file(path, f"{issue()},alice,u-1\n" + "#" * 2048 + "\n")
    with pytest.raises(TokenFileError, match="larger than 1024 bytes"):
        TokenFile(path, max_bytes=1024)


def test_a_missing_file_is_refused(path: Path) -> None:
    with pytest.raises(TokenFileError, match="cannot open"):
        TokenFile(path)


def test_a_changed_file_is_reloaded_after_a_second(path: Path) -> None:
    clock = FakeClock()
    old, new = issue("old"), issue("new")
    write_file(path, f"{old},alice,u-1\n")
    tokens = TokenFile(path, clock=clock)

    write_file(path, f"{new},alice,u-1,devs\n")
    assert tokens.principal(old) is not None, "looked at the file again within the second"
    assert tokens.principal(new) is None

    clock.advance(1.0)
    assert tokens.principal(new) == Principal(user="alice", uid="u-1", groups=("devs",))
    assert tokens.principal(old) is None


def test_a_file_rewritten_in_place_is_reloaded(path: Path) -> None:
    clock = FakeClock()
    old, new = issue("old"), issue("new-and-longer")
    write_file(path, f"{old},alice,u-1\n")
    tokens = TokenFile(path, clock=clock)

    path.write_text(f"{new},bob,u-2\n", encoding="utf-8")
    clock.advance(1.5)
    assert tokens.principal(new) == Principal(user="bob", uid="u-2", groups=())


def test_a_failed_reload_keeps_the_previous_table_and_warns_once(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    alice, shared = issue("alice"), issue("dup")
    write_file(path, f"{alice},alice,u-1\n")
    tokens = TokenFile(path, clock=clock)

    write_file(path, f"{shared},bob,u-2\n{shared},eve,u-3\n")
    clock.advance(1)
    assert tokens.principal(alice) == Principal(user="alice", uid="u-1", groups=())
    assert tokens.principal(shared) is None
    clock.advance(1)
    assert tokens.principal(alice) is not None

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "gateway.auth.tokens"]
    assert len(warnings) == 1
    assert str(path) in warnings[0].getMessage()
    assert "lines 1 and 2" in warnings[0].getMessage()


def test_a_rejected_file_is_picked_up_once_its_mode_is_fixed(path: Path) -> None:
    clock = FakeClock()
    alice, bob = issue("alice"), issue("bob")
    write_file(path, f"{alice},alice,u-1\n")
    tokens = TokenFile(path, clock=clock)

    write_file(path, f"{bob},bob,u-2\n", mode=0o644)
    clock.advance(1)
    assert tokens.principal(bob) is None

    os.chmod(path, 0o600)
    clock.advance(1)
    assert tokens.principal(bob) == Principal(user="bob", uid="u-2", groups=())


def test_a_file_briefly_missing_keeps_the_previous_table(path: Path) -> None:
    clock = FakeClock()
    alice = issue()
    write_file(path, f"{alice},alice,u-1\n")
    tokens = TokenFile(path, clock=clock)

    path.unlink()
    clock.advance(1)
    assert tokens.principal(alice) is not None
