from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kruntimes.gateway.auth import Principal, TokenFile, TokenFileError
from kruntimes.wire import tokens as token_format
from kruntimes.wire.tokens import TokenEntry, TokenFormatError
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


def test_a_file_with_comments_and_a_byte_order_mark_is_read(path: Path) -> None:
    alice = issue()
    path.write_bytes(f"\ufeff# token,user,uid,groups\n\n{alice},alice,u-1,devs\r\n".encode())
    os.chmod(path, 0o600)
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
        ("to ken,alice,u-1", "whitespace"),
        # the format's own problems (tested in full below) are named the same way
        ("{token},alice", "2 columns"),
        ('"{token},alice,u-1', "not valid CSV"),
    ],
    ids=["empty-token", "empty-user", "inner-space", "too-few-columns", "bad-quoting"],
)
def test_malformed_lines_are_refused_by_line_number(path: Path, line: str, problem: str) -> None:
    token = issue()
    write_file(path, f"{issue()},ok,u-0\n" + line.format(token=token) + "\n")
    with pytest.raises(TokenFileError) as caught:
        TokenFile(path)
    message = str(caught.value)
    assert message.startswith(f"token file {path}: line 2 ")
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

    warnings = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == "kruntimes.gateway.auth.tokens"
    ]
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


# --- the format itself (kruntimes.wire.tokens), shared by the gateway and the embedded platform ---


@pytest.mark.parametrize(
    ("line", "entry"),
    [
        ('tok,alice,u-1,"devs,ops"', TokenEntry("tok", "alice", "u-1", ("devs", "ops"))),
        ("tok,alice,u-1,devs", TokenEntry("tok", "alice", "u-1", ("devs",))),
        ("tok,alice,u-1", TokenEntry("tok", "alice", "u-1", ())),
        ("tok,alice,u-1,", TokenEntry("tok", "alice", "u-1", ())),
        (' tok , alice , u-1 ," devs , , ops "\r', TokenEntry("tok", "alice", "u-1", ("devs", "ops"))),
        ('"to,k",alice,', TokenEntry("to,k", "alice", "", ())),
    ],
    ids=["groups", "one-group", "no-groups-column", "empty-groups", "stripped", "quoted-token"],
)
def test_a_line_reads_as_token_user_uid_and_groups(line: str, entry: TokenEntry) -> None:
    assert token_format.parse_line(line) == entry


@pytest.mark.parametrize("line", ["", "   ", "\r", "# token,user,uid,groups", "   # indented,a,b"])
def test_blank_and_comment_lines_hold_no_entry(line: str) -> None:
    assert token_format.parse_line(line) is None


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{token},alice", "has 2 columns, expected token,user,uid[,groups]"),
        ("{token},alice,u-1,devs,extra", "has 5 columns, expected token,user,uid[,groups]"),
        ('"{token},alice,u-1', "is not valid CSV"),
        ('{token},alice,u-1,"de"vs"', "is not valid CSV"),
    ],
    ids=["too-few-columns", "too-many-columns", "open-quote", "stray-quote"],
)
def test_a_malformed_line_is_named_by_number_without_its_content(line: str, problem: str) -> None:
    token = issue()
    with pytest.raises(TokenFormatError) as caught:
        token_format.parse_line(line.format(token=token), line=7)
    assert str(caught.value) == f"line 7 {problem}"
    assert (caught.value.line, caught.value.problem) == (7, problem)
    assert token not in repr(caught.value)


def test_entries_are_numbered_by_their_line_in_the_file() -> None:
    text = "# header\n\na,alice,u-1\r\n  \nb,bob,u-2,ops\n"
    assert list(token_format.entries(text)) == [
        (3, TokenEntry("a", "alice", "u-1")),
        (5, TokenEntry("b", "bob", "u-2", ("ops",))),
    ]
    with pytest.raises(TokenFormatError, match="^line 2 has 2 columns"):
        list(token_format.entries("a,alice,u-1\nb,bob\n"))


def test_the_text_is_utf8_with_or_without_a_byte_order_mark() -> None:
    assert token_format.decode("\ufeffa,ä,u-1\n".encode()) == "a,ä,u-1\n"
    with pytest.raises(TokenFormatError, match="^line 2 is not UTF-8$"):
        token_format.decode(b"a,alice,u-1\nb,\xff,u-2\n")


def test_an_entry_is_written_as_the_line_it_is_read_from() -> None:
    admin = TokenEntry("krt_abc", "admin", "0", ("admins",))
    assert token_format.format_line(admin) == 'krt_abc,admin,0,"admins"\n'
    assert token_format.parse_line(token_format.format_line(admin)) == admin
    assert token_format.format_line(TokenEntry("t", "u", "1")) == 't,u,1,""\n'


_field = st.text(st.characters(codec="utf-8", exclude_characters="\n\r"), max_size=12).filter(
    lambda s: s == s.strip()
)
_group = st.text(st.characters(codec="utf-8", exclude_characters=',"\n\r'), min_size=1, max_size=8).filter(
    lambda s: s == s.strip()
)


@given(
    token=_field.filter(lambda s: s and not s.startswith("#")),
    user=_field,
    uid=_field,
    groups=st.lists(_group, max_size=4).map(tuple),
)
def test_every_writable_entry_reads_back_unchanged(
    token: str, user: str, uid: str, groups: tuple[str, ...]
) -> None:
    entry = TokenEntry(token, user, uid, groups)
    line = token_format.format_line(entry)
    assert list(token_format.entries(line)) == [(1, entry)]


@pytest.mark.parametrize(
    "entry",
    [
        TokenEntry(" {token}", "alice", "u-1"),
        TokenEntry("{token}", "ali\nce", "u-1"),
        TokenEntry("{token}", "alice", "u-1", ("a,b",)),
        TokenEntry("{token}", "alice", "u-1", ("",)),
        TokenEntry("", "alice", "u-1"),
        TokenEntry("#{token}", "alice", "u-1"),
    ],
    ids=["spaced-token", "newline-user", "comma-group", "empty-group", "empty-token", "comment-token"],
)
def test_an_entry_that_would_not_read_back_is_refused_without_its_token(entry: TokenEntry) -> None:
    token = issue()
    bad = TokenEntry(entry.token.format(token=token), entry.user, entry.uid, entry.groups)
    with pytest.raises(ValueError) as caught:
        token_format.format_line(bad)
    assert token not in str(caught.value)


def test_an_entry_can_be_logged_without_its_token() -> None:
    token = issue()
    entry = TokenEntry(token, "alice", "u-1", ("devs",))
    assert token not in repr(entry) and token not in str(entry)
    assert "alice" in repr(entry)
