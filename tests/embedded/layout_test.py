"""The embedded platform's state dir: its paths, the admin token it keeps, the ports it keeps."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import stat
from pathlib import Path

import pytest

from kruntimes.gateway.auth import Principal, TokenFile
from kruntimes.workers.embedded.errors import PlatformError
from kruntimes.workers.embedded.layout import PORT_NAMES, Layout, admin_token, ports, recheck_ports


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


def test_a_port_taken_after_it_was_picked_is_picked_again_before_its_component_starts(
    tmp_path: Path,
) -> None:
    """What `krt up` does once the dev server opened ports of its own: a port picked for the
    gateway or the worker that is taken now gets a new one; the others (and the dev server's,
    in use by it) stay."""
    layout = Layout(tmp_path)
    first = ports(layout)
    with socket.socket() as dev_server, socket.socket() as internal:
        dev_server.bind(("127.0.0.1", first["temporal"]))
        internal.bind(("127.0.0.1", first["workerMetrics"]))
        again = recheck_ports(layout, first, ("gateway", "heartbeat", "workerMetrics"))
    assert again["workerMetrics"] != first["workerMetrics"]
    assert {k: v for k, v in again.items() if k != "workerMetrics"} == {
        k: v for k, v in first.items() if k != "workerMetrics"
    }
    assert len(set(again.values())) == len(PORT_NAMES)
    assert json.loads(layout.ports.read_text()) == again


def test_a_saved_file_naming_one_port_twice_gets_distinct_ports(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    first = ports(layout)
    layout.ports.write_text(json.dumps({**first, "workerMetrics": first["gateway"]}))
    again = ports(layout)
    assert len(set(again.values())) == len(PORT_NAMES)
    assert again["gateway"] == first["gateway"]


def test_the_platform_pki_is_made_once_private_and_names_each_component(tmp_path: Path) -> None:
    from cryptography import x509

    from kruntimes.pki import PeerTLS, Role, identity_of
    from kruntimes.workers.embedded.layout import ensure_pki

    layout = Layout(tmp_path)
    layout.root.mkdir(exist_ok=True)
    ensure_pki(layout)
    assert stat.S_IMODE(os.stat(layout.pki).st_mode) == 0o700
    for private in (
        layout.pki / "ca.key",
        layout.assignment_key,
        layout.gateway_tls / "tls.key",
        layout.worker_tls / "tls.key",
    ):
        assert stat.S_IMODE(os.stat(private).st_mode) == 0o600, private
    assert (
        PeerTLS(layout.gateway_tls, role=Role.GATEWAY).identity.uri
        == "spiffe://kruntimes.io/gateway/gateway-0"
    )
    assert PeerTLS(layout.worker_tls, role=Role.CONTROL_PLANE).identity.uri == (
        "spiffe://kruntimes.io/control-plane/worker-0"
    )
    assert layout.assignment_public_key.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    kept = {
        p: p.read_bytes()
        for p in (layout.pki / "ca.crt", layout.assignment_key, layout.gateway_tls / "tls.crt")
    }
    ensure_pki(layout)  # a restart keeps what is not due
    assert {p: p.read_bytes() for p in kept} == kept
    # a certificate of another CA (the CA was replaced) is issued anew
    for name in ("ca.crt", "ca.key", "bundle.crt", "ca-state.json"):
        (layout.pki / name).unlink()
    ensure_pki(layout)
    cert = x509.load_pem_x509_certificate((layout.gateway_tls / "tls.crt").read_bytes())
    assert (layout.gateway_tls / "tls.crt").read_bytes() != kept[layout.gateway_tls / "tls.crt"]
    assert identity_of(cert).uri == "spiffe://kruntimes.io/gateway/gateway-0"
    assert (layout.gateway_tls / "ca.crt").read_bytes() == (layout.pki / "ca.crt").read_bytes()
