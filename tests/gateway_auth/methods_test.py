"""The gateway's auth methods, registered by name: `--auth` offers exactly them, each adds its own
flags, and a missing flag stops the gateway with one line naming it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kruntimes.gateway.auth import CachingAuthorizer, Resource
from kruntimes.gateway.auth.base import AuthConfigError
from kruntimes.gateway.auth.methods import DEFAULT_METHOD, METHODS, add_arguments, authorizer_from
from tests.gateway_auth.helpers import issue, write_file


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p


def test_auth_offers_exactly_the_registered_methods_each_under_its_own_name() -> None:
    auth = next(a for a in parser()._actions if a.dest == "auth")
    assert list(auth.choices or ()) == list(METHODS) == ["embedded", "kubernetes"]
    assert all(method.name == name for name, method in METHODS.items())
    assert parser().parse_args([]).auth == DEFAULT_METHOD == "embedded"


def test_an_unregistered_method_is_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["--auth", "ldap"])


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("embedded", "--auth embedded needs --token-file and --role-bindings"),
        ("kubernetes", "--auth kubernetes needs --kubernetes-api"),
    ],
)
def test_a_method_without_its_flags_is_one_line_naming_them(name: str, message: str) -> None:
    with pytest.raises(AuthConfigError) as caught:
        authorizer_from(parser().parse_args(["--auth", name]))
    assert str(caught.value) == message


async def test_the_embedded_method_authorizes_from_its_files_behind_the_cache(tmp_path: Path) -> None:
    token = issue("methods")
    tokens = write_file(tmp_path / "tokens.csv", f'{token},alice,1000,"devs"\n')
    bindings = write_file(
        tmp_path / "bindings.yaml", "bindings:\n  - namespace: default\n    users: [alice]\n"
    )
    args = parser().parse_args(["--token-file", str(tokens), "--role-bindings", str(bindings)])
    authorizer = authorizer_from(args)
    try:
        assert isinstance(authorizer, CachingAuthorizer)
        principal = await authorizer.authorize(token, Resource(namespace="default", name="r", run_uid="u"))
        assert principal.user == "alice"
    finally:
        await authorizer.close()
