"""`krt up`'s role bindings let its owner (client.json's identity, `admin`) use every namespace's
secrets and nobody else; a file left as an older `krt up` wrote it gets that rule, an edited one
is kept, and one others could write is closed (hosts refuse it)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kruntimes.config.bindings import RoleBindings, read_file
from kruntimes.gateway.auth import Principal
from kruntimes.workers.embedded.layout import ADMIN_GROUP, ADMIN_USER, Layout, prepare

BEFORE_SECRETS = f"""\
# Who may invoke which namespace's Runs: users or groups from tokens.csv, namespace or "*".
bindings:
  - namespace: "*"
    groups: [{ADMIN_GROUP}]
"""


def test_the_owner_uses_every_namespaces_secrets_and_nobody_else(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "state")
    prepare(layout)
    _, bindings = read_file(layout.bindings)  # as a host reads it: a mode it accepts
    for namespace in ("default", "team-a"):
        assert bindings.may_use_secret(ADMIN_USER, namespace, "db")
        assert not bindings.may_use_secret("mallory", namespace, "db")
        assert bindings.allows(Principal(user="x", uid="", groups=(ADMIN_GROUP,)), namespace)
    assert not bindings.allows(Principal(user=ADMIN_USER, uid="", groups=()), "default"), "invoke: its group"


def test_an_older_default_gets_the_secrets_rule_and_an_edited_file_is_kept(tmp_path: Path) -> None:
    old = Layout(tmp_path / "old")
    old.root.mkdir(mode=0o700)
    old.bindings.write_text(BEFORE_SECRETS)
    prepare(old)
    assert RoleBindings.load(old.bindings).may_use_secret(ADMIN_USER, "default", "db")
    edited = Layout(tmp_path / "edited")
    edited.root.mkdir(mode=0o700)
    edited.bindings.write_text(BEFORE_SECRETS + "  - namespace: team-a\n    users: [alice]\n")
    edited.bindings.chmod(0o666)
    prepare(edited)
    assert not RoleBindings.load(edited.bindings).may_use_secret(ADMIN_USER, "default", "db")
    assert stat.S_IMODE(os.stat(edited.bindings).st_mode) == 0o644
