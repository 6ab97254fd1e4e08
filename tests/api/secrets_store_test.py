"""The embedded secret store: names and values within bounds, files only the owner reads."""

from __future__ import annotations

import stat

import pytest

from kruntimes.config import secret_store as secrets


def test_create_list_replace_delete(tmp_path):
    secrets.create(tmp_path, namespace="default", name="db", values={"PASSWORD": b"x", "USER": b"y"})
    assert secrets.names(tmp_path, namespace="default") == [("db", ["PASSWORD", "USER"])]
    directory = secrets.create(tmp_path, namespace="default", name="db", values={"TOKEN": b"z"})
    assert secrets.names(tmp_path, namespace="default") == [("db", ["TOKEN"])], "replaced whole"
    assert stat.S_IMODE((directory / "TOKEN").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "secrets").stat().st_mode) == 0o700
    assert secrets.delete(tmp_path, namespace="default", name="db")
    assert not secrets.delete(tmp_path, namespace="default", name="db")
    assert secrets.names(tmp_path, namespace="other") == []


@pytest.mark.parametrize(
    ("namespace", "name", "values"),
    [
        ("default", "../etc", {"K": b"v"}),
        ("Bad_NS", "db", {"K": b"v"}),
        ("default", "db", {}),
        ("default", "db", {"not-an-env-name": b"v"}),
        ("default", "db", {"K": b"\x00"}),
        ("default", "db", {"K": b"\xff\xfe"}),
        ("default", "db", {"K": b"x" * (33 * 1024)}),
    ],
)
def test_out_of_bounds_secrets_are_refused_without_their_values_in_the_message(
    tmp_path, namespace, name, values
):
    with pytest.raises(secrets.SecretError) as err:
        secrets.create(tmp_path, namespace=namespace, name=name, values=values)
    for value in values.values():
        if len(value) > 3:
            assert value.decode(errors="ignore")[:8] not in str(err.value)


def test_a_secret_directory_linked_from_another_namespace_is_not_listed(tmp_path):
    theirs = secrets.create(tmp_path, namespace="team-a", name="db", values={"K": b"v"})
    (tmp_path / "secrets" / "team-b").mkdir(mode=0o700)
    (tmp_path / "secrets" / "team-b" / "db").symlink_to(theirs)
    assert secrets.names(tmp_path, namespace="team-b") == []
    assert secrets.names(tmp_path, namespace="team-a") == [("db", ["K"])]
