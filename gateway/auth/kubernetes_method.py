"""The kubernetes auth method: the API server answers, for the caller's own token, whether they
may `get` the Run (gateway/auth/kubernetes.py, whose client is imported only when it is used)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kruntimes.gateway.auth.base import AuthConfigError, Authorizer


class KubernetesMethod:
    name = "kubernetes"

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument("--kubernetes-api", help="kubernetes: API server URL for SelfSubjectAccessReviews")
        group.add_argument("--kubernetes-ca", type=Path, help="kubernetes: CA bundle of the API server")

    def authorizer(self, args: argparse.Namespace) -> Authorizer:
        if not args.kubernetes_api:
            raise AuthConfigError(f"--auth {self.name} needs --kubernetes-api")
        from kruntimes.gateway.auth.kubernetes import KubernetesAuthorizer  # its client only when used

        ca = str(args.kubernetes_ca) if args.kubernetes_ca else None
        # who the caller is, for a server that records it (krt mcp sets it); the gateway does not
        identify = bool(getattr(args, "kubernetes_identify", False))
        return KubernetesAuthorizer(args.kubernetes_api, ca_file=ca, identify=identify)
