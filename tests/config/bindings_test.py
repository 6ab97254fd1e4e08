"""The role bindings document (kruntimes.config.bindings): `use-secrets` for Run creators beside the
gateway's `invoke`, each verb granting only itself, and every mistake refused by entry and field."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kruntimes.config.bindings import MAX_NAMES, BindingsError, RoleBindings, read_file
from kruntimes.gateway.auth import Principal

BINDINGS = """
bindings:
  - namespace: "*"
    groups: [admins]
  - namespace: "*"
    verbs: [use-secrets]
    users: [admin]
  - namespace: team-a
    verbs: [invoke, use-secrets]
    users: [team-a-ci]
  - namespace: team-b
    verbs: [use-secrets]
    users: [system:serviceaccount:team-b:nightly, ops@example.com]
    secrets: [db, cache]
  - namespace: team-b
    verbs: [use-secrets]
    users: [ops@example.com]
    secrets: [queue]
"""


@pytest.fixture(scope="module")
def bindings() -> RoleBindings:
    return RoleBindings.from_yaml(BINDINGS)


def test_the_owner_may_use_every_namespaces_secrets(bindings: RoleBindings) -> None:
    for namespace in ("default", "team-a", "team-b"):
        assert bindings.may_use_secret("admin", namespace, "db")


def test_a_creator_bound_to_a_namespace_uses_its_secrets_there_only(bindings: RoleBindings) -> None:
    assert bindings.may_use_secret("team-a-ci", "team-a", "anything")
    assert not bindings.may_use_secret("team-a-ci", "team-b", "db")
    assert not bindings.may_use_secret("team-a-ci", "default", "db")


def test_a_binding_naming_secrets_allows_those_and_bindings_add_up(bindings: RoleBindings) -> None:
    nightly = "system:serviceaccount:team-b:nightly"
    assert bindings.may_use_secret(nightly, "team-b", "db")
    assert bindings.may_use_secret(nightly, "team-b", "cache")
    assert not bindings.may_use_secret(nightly, "team-b", "queue")
    assert bindings.may_use_secret("ops@example.com", "team-b", "queue")
    assert bindings.may_use_secret("ops@example.com", "team-b", "db")
    assert not bindings.may_use_secret("ops@example.com", "team-b", "other")


def test_each_verb_grants_only_itself(bindings: RoleBindings) -> None:
    assert not bindings.allows(Principal(user="admin", uid="", groups=()), "team-a"), "use-secrets only"
    assert bindings.allows(Principal(user="team-a-ci", uid="", groups=()), "team-a")
    assert bindings.allows(Principal(user="x", uid="", groups=("admins",)), "team-b")
    assert not bindings.may_use_secret("admins", "team-b", "db"), "a group is not a creator"


def test_nobody_else_and_no_file_allow_nothing(bindings: RoleBindings) -> None:
    assert not bindings.may_use_secret("mallory", "team-a", "db")
    assert not bindings.may_use_secret("*", "team-a", "db")
    assert not RoleBindings.from_yaml("").may_use_secret("admin", "default", "db")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("bindings: [{namespace: '*', verbs: [use-secret], users: [a]}]", "bindings[0].verbs[0]"),
        ("bindings: [{namespace: '*', verbs: [], users: [a]}]", "bindings[0].verbs: name at least one"),
        ("bindings: [{namespace: '*', verbs: use-secrets, users: [a]}]", "bindings[0].verbs: must be a list"),
        ("bindings: [{namespace: '*', verbs: [use-secrets], groups: [g]}]", "bindings[0].groups"),
        ("bindings: [{namespace: '*', verbs: [use-secrets], users: ['a b']}]", "bindings[0].users[0]"),
        ("bindings: [{namespace: '*', users: [a], secrets: [db]}]", "only a binding with use-secrets"),
        ("bindings: [{namespace: '*', verbs: [use-secrets], users: [a], secrets: [../x]}]", "secrets[0]"),
        ("bindings: [{namespace: Team-A, users: [a]}]", "bindings[0].namespace: a DNS-1123 label"),
        ("bindings: [{namespace: '*', verbs: [use-secrets], user: [a]}]", "bindings[0].user: unknown field"),
    ],
    ids=[
        "misspelt-verb",
        "no-verb",
        "verbs-not-a-list",
        "groups-for-secrets",
        "subject-with-a-space",
        "secrets-without-the-verb",
        "secret-not-a-label",
        "namespace-not-a-label",
        "misspelt-users",
    ],
)
def test_a_bindings_mistake_is_refused_naming_the_entry_and_field(text: str, said: str) -> None:
    with pytest.raises(BindingsError, match="role bindings are malformed") as err:
        RoleBindings.from_yaml(text)
    assert said in str(err.value)


def test_aliases_count_as_the_names_they_repeat() -> None:
    names = ", ".join(f"u{i}" for i in range(1000))
    again = "  - {namespace: '*', verbs: [use-secrets], users: *u}\n" * (MAX_NAMES // 1000)
    text = f"bindings:\n  - {{namespace: '*', verbs: [use-secrets], users: &u [{names}]}}\n{again}"
    assert len(text) < 64 * 1024
    with pytest.raises(BindingsError, match=f"name more than {MAX_NAMES}"):
        RoleBindings.from_yaml(text)


def test_a_configmap_volumes_links_are_followed_within_their_directory(tmp_path: Path) -> None:
    """The kubelet's layout: rolebindings.yaml -> ..data/rolebindings.yaml, ..data -> ..<time>."""
    stamped = tmp_path / "..2030_01_01_00_00_00.000000001"
    stamped.mkdir()
    (stamped / "rolebindings.yaml").write_text(BINDINGS)
    os.symlink(stamped.name, tmp_path / "..data")
    os.symlink("..data/rolebindings.yaml", tmp_path / "rolebindings.yaml")
    assert read_file(tmp_path / "rolebindings.yaml")[1].may_use_secret("admin", "default", "db")


def test_a_bindings_file_others_could_change_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rolebindings.yaml"
    path.write_text(BINDINGS)
    path.chmod(0o644)
    assert read_file(path)[1].may_use_secret("admin", "default", "db")
    path.chmod(0o664)
    with pytest.raises(BindingsError, match="mode 0664"):
        read_file(path)
    path.chmod(0o600)
    elsewhere = tmp_path / "mounted"
    elsewhere.mkdir()
    link = elsewhere / "rolebindings.yaml"
    os.symlink(path, link)
    with pytest.raises(BindingsError, match="a symlink out of its directory"):
        read_file(link)
    path.write_bytes(b"#" * (1024 * 1024 + 1))
    with pytest.raises(BindingsError, match="larger than"):
        read_file(path)
