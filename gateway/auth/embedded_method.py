"""The embedded auth method: a token file says who the caller is, role bindings what they may
invoke (gateway/auth/tokens.py, gateway/auth/bindings.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kruntimes.gateway.auth.base import AuthConfigError, Authorizer
from kruntimes.gateway.auth.bindings import EmbeddedAuthorizer, RoleBindings
from kruntimes.gateway.auth.tokens import TokenFile


class EmbeddedMethod:
    name = "embedded"

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--token-file", type=Path, help='embedded: token,user,uid,"groups" CSV (mode 0600)'
        )
        group.add_argument("--role-bindings", type=Path, help="embedded: namespace role bindings YAML")

    def authorizer(self, args: argparse.Namespace) -> Authorizer:
        if not args.token_file or not args.role_bindings:
            raise AuthConfigError(f"--auth {self.name} needs --token-file and --role-bindings")
        return EmbeddedAuthorizer(TokenFile(args.token_file), RoleBindings.load(args.role_bindings))
