"""The embedded platform's state dir: its paths, the admin token it keeps, the ports it keeps."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import stat
from pathlib import Path

import pytest

from gateway.auth import Principal, TokenFile
from workers.embedded.errors import PlatformError
from workers.embedded.layout import PORT_NAMES, Layout, admin_token, ports


def test_a_layout_is_a_frozen_value_naming_the_files_of_its_root(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    assert layout == Layout(tmp_path) and hash(layout) == hash(Layout(tmp_path))
    assert (layout.tokens, layout.up, layout.log("gateway")) == (
        tmp_path / "tokens.csv",
        tmp_path / "up.json",
        tmp_path / "logs" / "gateway.log",
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.root = tmp_path / "other"  # type: ignore[misc]


def test_the_admin_token_is_generated_once_into_a_file_the_gateway_reads(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    token = admin_token(layout)
    assert stat.S_IMODE(os.stat(layout.tokens).st_mode) == 0o600
    assert TokenFile(layout.tokens).principal(token) == Principal(user="admin", uid="0", groups=("admins",))
    written = layout.tokens.read_bytes()
    assert admin_token(layout) == token
    assert layout.tokens.read_bytes() == written


def test_the_admin_token_is_the_first_entry_of_user_admin(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    text = '# callers\n\nbob-token,bob,admin,"devs"\n"admin-token",admin,0,"admins"\nlater,admin,1\n'
    layout.tokens.write_text(text)
    assert admin_token(layout) == "admin-token"
    assert layout.tokens.read_text() == text


def test_a_malformed_token_file_is_refused_not_replaced(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    text = "secret-one,bob,u-1\nsecret-two,admin\n"
    layout.tokens.write_text(text)
    with pytest.raises(PlatformError) as caught:
        admin_token(layout)
    assert (
        str(caught.value)
        == f"token file {layout.tokens}: line 2 has 2 columns, expected token,user,uid[,groups]"
    )
    assert "secret" not in str(caught.value)
    assert layout.tokens.read_text() == text


def test_saved_ports_are_kept_while_free_and_a_taken_one_is_replaced(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    first = ports(layout)
    assert set(first) == set(PORT_NAMES)
    assert json.loads(layout.ports.read_text()) == first
    assert ports(layout) == first
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first["gateway"]))
        again = ports(layout)
    assert again["gateway"] != first["gateway"]
    assert {k: v for k, v in again.items() if k != "gateway"} == {
        k: v for k, v in first.items() if k != "gateway"
    }
    assert json.loads(layout.ports.read_text()) == again
