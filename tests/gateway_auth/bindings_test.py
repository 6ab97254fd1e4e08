from __future__ import annotations

from pathlib import Path

import pytest

from kruntimes.gateway.auth import (
    EmbeddedAuthorizer,
    Forbidden,
    Principal,
    Resource,
    RoleBindings,
    TokenFile,
    Unauthenticated,
)
from tests.gateway_auth.helpers import issue, write_file

BINDINGS = """
bindings:
  - namespace: team-a
    users: [alice]
  - namespace: team-b
    groups: [b-devs]
  - namespace: "*"
    users: [root]
    groups: [platform]
"""


def who(user: str, *groups: str) -> Principal:
    return Principal(user=user, uid=f"uid-{user}", groups=groups)


@pytest.fixture
def bindings() -> RoleBindings:
    return RoleBindings.from_yaml(BINDINGS)


def test_a_user_bound_to_a_namespace_may_invoke_only_there(bindings: RoleBindings) -> None:
    assert bindings.allows(who("alice"), "team-a")
    assert not bindings.allows(who("alice"), "team-b")
    assert not bindings.allows(who("alice"), "default")


def test_a_group_bound_to_a_namespace_admits_its_members(bindings: RoleBindings) -> None:
    assert bindings.allows(who("bob", "b-devs"), "team-b")
    assert bindings.allows(who("carol", "other", "b-devs"), "team-b")
    assert not bindings.allows(who("bob", "b-devs"), "team-a")
    assert not bindings.allows(who("b-devs"), "team-b"), "a user named like a group is not the group"


def test_a_star_binding_covers_every_namespace(bindings: RoleBindings) -> None:
    for namespace in ("team-a", "team-b", "default", "kube-system"):
        assert bindings.allows(who("root"), namespace)
        assert bindings.allows(who("dana", "platform"), namespace)


def test_nobody_else_is_allowed(bindings: RoleBindings) -> None:
    assert not bindings.allows(who("mallory", "devs"), "team-a")
    assert not bindings.allows(who("mallory"), "*")


def test_empty_bindings_allow_nobody() -> None:
    assert not RoleBindings.from_yaml("").allows(who("alice"), "team-a")
    assert not RoleBindings.from_yaml("bindings: []").allows(who("alice"), "team-a")


@pytest.mark.parametrize(
    "text",
    [
        "bindings: [",
        "- namespace: team-a",
        "bindings: [{namespace: team-a, user: [alice]}]",
        "bindings: [{users: [alice]}]",
        "bindings: [{namespace: '', users: [alice]}]",
        "bindings: [{namespace: team-a, users: alice}]",
        "bindings: [{namespace: 7, users: [alice]}]",
        "roles: []",
    ],
    ids=[
        "not-yaml",
        "not-a-mapping",
        "misspelt-key",
        "no-namespace",
        "empty-namespace",
        "users-not-a-list",
        "namespace-not-a-string",
        "unknown-top-level-key",
    ],
)
def test_malformed_bindings_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="role bindings"):
        RoleBindings.from_yaml(text)


def test_bindings_load_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "bindings.yaml"
    path.write_text(BINDINGS, encoding="utf-8")
    assert RoleBindings.load(path).allows(who("alice"), "team-a")


@pytest.fixture
def tokens() -> dict[str, str]:
    return {"alice": issue("alice"), "bob": issue("bob")}


@pytest.fixture
def embedded(tmp_path: Path, tokens: dict[str, str], bindings: RoleBindings) -> EmbeddedAuthorizer:
    path = write_file(
        tmp_path / "tokens.csv",
        f"{tokens['alice']},alice,u-1\n{tokens['bob']},bob,u-2,b-devs\n",
    )
    return EmbeddedAuthorizer(TokenFile(path), bindings)


async def test_embedded_mode_allows_a_known_token_in_a_bound_namespace(
    embedded: EmbeddedAuthorizer, tokens: dict[str, str]
) -> None:
    run = Resource(namespace="team-a", name="hello", run_uid="r-1")
    assert await embedded.authorize(tokens["alice"], run) == Principal(user="alice", uid="u-1", groups=())
    run_b = Resource(namespace="team-b", name="hello", run_uid="r-2")
    assert await embedded.authorize(tokens["bob"], run_b) == Principal(
        user="bob", uid="u-2", groups=("b-devs",)
    )


async def test_embedded_mode_forbids_a_known_token_elsewhere(
    embedded: EmbeddedAuthorizer, tokens: dict[str, str]
) -> None:
    with pytest.raises(Forbidden) as caught:
        await embedded.authorize(tokens["alice"], Resource(namespace="team-b", name="hello", run_uid="r-2"))
    assert caught.value.status == 403
    assert tokens["alice"] not in str(caught.value)


async def test_embedded_mode_does_not_know_other_tokens(embedded: EmbeddedAuthorizer) -> None:
    stranger = issue("stranger")
    with pytest.raises(Unauthenticated) as caught:
        await embedded.authorize(stranger, Resource(namespace="team-a", name="hello", run_uid="r-1"))
    assert caught.value.status == 401
    assert stranger not in str(caught.value)
    await embedded.close()
