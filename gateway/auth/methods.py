"""The gateway's auth methods, registered by name: one line each in `METHODS`.

`krt gateway --auth NAME` picks one (the Helm chart's `gateway.auth.method`, whose schema enum is
checked against these names by tests/helm/auth_methods_test.py); each method adds its own flags
and builds its Authorizer from them, which the gateway puts behind `CachingAuthorizer`. A method
module loads its authorizer's client only when the method is used.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from types import MappingProxyType
from typing import Protocol

from kruntimes.gateway.auth.base import AuthConfigError, Authorizer

__all__ = ["DEFAULT_METHOD", "METHODS", "AuthConfigError", "AuthMethod", "add_arguments", "authorizer_from"]
from kruntimes.gateway.auth.cache import CachingAuthorizer
from kruntimes.gateway.auth.embedded_method import EmbeddedMethod
from kruntimes.gateway.auth.kubernetes_method import KubernetesMethod


class AuthMethod(Protocol):
    name: str

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        """Add its flags, each prefixed in its help with `NAME:`."""
        ...

    def authorizer(self, args: argparse.Namespace) -> Authorizer:
        """Its Authorizer from its flags; AuthConfigError when one is missing."""
        ...


METHODS: Mapping[str, AuthMethod] = MappingProxyType(
    {
        method.name: method
        for method in (
            EmbeddedMethod(),
            KubernetesMethod(),
        )
    }
)
DEFAULT_METHOD = EmbeddedMethod.name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--auth` and every method's flags."""
    group = parser.add_argument_group("authorization of invokes")
    group.add_argument("--auth", choices=list(METHODS), default=DEFAULT_METHOD)
    for method in METHODS.values():
        method.add_arguments(group)


def authorizer_from(args: argparse.Namespace) -> Authorizer:
    """The chosen method's Authorizer behind the decision cache; AuthConfigError when its flags
    cannot make one."""
    return CachingAuthorizer(METHODS[args.auth].authorizer(args))
