"""`krt gateway` / `python -m gateway`: the HTTPS invoke gateway.

Temporal is optional here: with `--temporal-address` (or KRT_TEMPORAL_ADDRESS) the gateway keeps
the known-Runs view (a route-cache miss for a Run that exists answers 503, not 404), connecting
with the shared --temporal-* flags (TLS, mTLS, API key file; kruntimes.temporal). It only lists
RunWorkflows; the invoke path never calls Temporal.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
from pathlib import Path

from gateway.auth import (
    Authorizer,
    CachingAuthorizer,
    EmbeddedAuthorizer,
    RoleBindings,
    TokenFile,
)
from gateway.listener import HttpLimits
from gateway.server import Gateway, GatewayOptions
from gateway.visibility import Visibility, VisibilityError
from kruntimes import logs
from kruntimes import temporal_settings as temporal
from kruntimes.assignments import AssignmentError, Verifier
from kruntimes.pki import PeerTLS, PeerTLSError, Role
from kruntimes.serving import stop_event, write_ready_file
from kruntimes.temporal_settings import TemporalSettings

GC_THRESHOLDS = (20_000, 50, 100)
VERIFY_CACHE = 1024  # verified assignments the verifier keeps (the route cache keeps the rest)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="krt gateway", description="Run the kruntimes HTTPS invoke gateway.")
    p.add_argument("--listen", default="127.0.0.1:8443", help="HTTPS address (port 0: pick one)")
    p.add_argument("--heartbeat-listen", default="127.0.0.1:0", help="gRPC address hosts send heartbeats to")
    p.add_argument("--cert", type=Path, required=True, help="serving certificate (PEM)")
    p.add_argument("--key", type=Path, required=True, help="serving key (PEM)")
    p.add_argument(
        "--peer-tls",
        type=Path,
        required=True,
        help="the gateway's platform certificate directory (tls.crt, tls.key, ca.crt; a gateway identity "
        "of the platform CA) for heartbeats from hosts and invokes to them; reloaded on change",
    )
    p.add_argument(
        "--assignment-public-key",
        type=Path,
        required=True,
        help="the control plane's assignment public key(s) (PEM): only routes they verify are served",
    )
    p.add_argument("--auth", choices=["embedded", "kubernetes"], default="embedded")
    p.add_argument("--token-file", type=Path, help='embedded: token,user,uid,"groups" CSV (mode 0600)')
    p.add_argument("--role-bindings", type=Path, help="embedded: namespace role bindings YAML")
    p.add_argument("--kubernetes-api", help="kubernetes: API server URL for SelfSubjectAccessReviews")
    p.add_argument("--kubernetes-ca", type=Path, help="kubernetes: CA bundle of the API server")
    p.add_argument("--ready-file", type=Path, help="write {url, heartbeatAddress, pid} here once serving")
    p.add_argument("--log-level", default="info")
    limits = p.add_argument_group("connection limits (each connection and request is bounded)")
    default = HttpLimits()
    limits.add_argument(
        "--header-timeout",
        type=float,
        default=default.header_timeout_s,
        metavar="S",
        help="a new connection's TLS handshake, then each request's headers, must be complete "
        "within S seconds (on a kept-alive connection: from the request's first byte) (default %(default)s)",
    )
    limits.add_argument(
        "--body-timeout",
        type=float,
        default=default.body_timeout_s,
        metavar="S",
        help="a request body may arrive at any rate for its first S seconds ... (default %(default)s)",
    )
    limits.add_argument(
        "--body-min-rate",
        type=int,
        default=default.body_min_rate,
        metavar="BYTES",
        help="... and then at BYTES per second at least, on average "
        "(else 408 RequestBodyTimeout) (default %(default)s)",
    )
    limits.add_argument(
        "--idle-timeout",
        type=float,
        default=default.idle_timeout_s,
        metavar="S",
        help="a kept-alive connection with no request for S seconds is closed (default %(default)s)",
    )
    limits.add_argument(
        "--max-connections",
        type=int,
        default=default.max_connections,
        metavar="N",
        help="open connections at most; more are closed at accept "
        "(the open ones are served) (default %(default)s)",
    )
    limits.add_argument(
        "--max-connections-per-client",
        type=int,
        default=default.max_connections_per_client,
        metavar="N",
        help="open connections from one client address at most; more are closed at accept "
        "(default %(default)s)",
    )
    temporal.add_arguments(p)
    # no Temporal unless an address is given: the known-Runs view is optional
    p.set_defaults(temporal_address=None)
    return p.parse_args(argv)


def limits_from(args: argparse.Namespace) -> HttpLimits:
    try:
        return HttpLimits(
            header_timeout_s=args.header_timeout,
            body_timeout_s=args.body_timeout,
            body_min_rate=args.body_min_rate,
            idle_timeout_s=args.idle_timeout,
            max_connections=args.max_connections,
            max_connections_per_client=args.max_connections_per_client,
        )
    except ValueError as e:
        message = str(e)
        for field, flag in _LIMIT_FLAGS.items():
            message = message.replace(field, flag)
        raise SystemExit(f"krt gateway: {message}") from None


_LIMIT_FLAGS = {
    "max_connections_per_client": "--max-connections-per-client",
    "max_connections": "--max-connections",
    "header_timeout_s": "--header-timeout",
    "body_timeout_s": "--body-timeout",
    "body_min_rate": "--body-min-rate",
    "idle_timeout_s": "--idle-timeout",
}


def temporal_settings(args: argparse.Namespace, env: dict[str, str] | None = None) -> TemporalSettings | None:
    """The known-Runs view's connection, or None when no Temporal address is configured."""
    env = dict(os.environ) if env is None else env
    if args.temporal_address is None and not env.get(temporal.ENV["address"]):
        return None
    try:
        return temporal.settings_from(args, env)
    except ValueError as e:
        raise SystemExit(f"krt gateway: the Temporal settings are unusable: {e}") from None


def authorizer_from(args: argparse.Namespace) -> Authorizer:
    inner: Authorizer
    if args.auth == "kubernetes":
        if not args.kubernetes_api:
            raise SystemExit("krt gateway: --auth kubernetes needs --kubernetes-api")
        from gateway.auth.kubernetes import KubernetesAuthorizer  # its client only when used

        ca = str(args.kubernetes_ca) if args.kubernetes_ca else None
        inner = KubernetesAuthorizer(args.kubernetes_api, ca_file=ca)
    else:
        if not args.token_file or not args.role_bindings:
            raise SystemExit("krt gateway: --auth embedded needs --token-file and --role-bindings")
        inner = EmbeddedAuthorizer(TokenFile(args.token_file), RoleBindings.load(args.role_bindings))
    return CachingAuthorizer(inner)


async def connect_temporal(settings: TemporalSettings | None) -> Visibility | None:
    """The known-Runs view's reader of Temporal visibility (no Temporal SDK in the gateway)."""
    if settings is None:
        return None
    try:
        return await Visibility.connect(settings)
    except VisibilityError as e:  # unreachable, refused, unreadable TLS files
        raise SystemExit(f"krt gateway: cannot connect to Temporal at {settings.address}: {e}") from None


async def serve(args: argparse.Namespace, *, invoke_tls: bool = True) -> None:
    try:
        peer_tls = PeerTLS(args.peer_tls, role=Role.GATEWAY)
        # The route cache recognises unchanged registrations itself: the verifier's own cache of
        # verified assignments would only hold a second copy of every route's bytes.
        assignments = Verifier.load(args.assignment_public_key, cache_size=VERIFY_CACHE)
    except (PeerTLSError, AssignmentError) as e:
        raise SystemExit(f"krt gateway: {e}") from None
    limits = limits_from(args)
    known = await connect_temporal(temporal_settings(args))
    host, _, port = args.listen.rpartition(":")
    gateway = Gateway(
        GatewayOptions(
            listen_host=host,
            listen_port=int(port),
            heartbeat_listen=args.heartbeat_listen,
            cert_file=args.cert,
            key_file=args.key,
            authorizer=authorizer_from(args),
            temporal=known,
            limits=limits,
            peer_tls=peer_tls,
            assignments=assignments,
            invoke_tls=invoke_tls,
        )
    )
    url = await gateway.start()
    # Start-up objects never need collecting, and fewer, younger collections keep the tail short:
    # a full collection over the imported modules is a multi-millisecond pause for every request.
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    if args.ready_file:
        write_ready_file(args.ready_file, url=url, heartbeatAddress=gateway.heartbeat_address)
    await stop_event().wait()
    await gateway.stop()


def main(argv: list[str] | None = None, *, invoke_tls: bool = True) -> None:
    """`invoke_tls=False` is the invoke bench's plaintext baseline (bench/invoke.py); no flag."""
    args = parse_args(argv)
    logs.setup(args.log_level)
    try:
        # uvloop when installed: the same servers spend less CPU per request on it than on
        # asyncio's loop (bench/invoke.py runs its reference chain on both)
        import uvloop
    except ImportError:
        asyncio.run(serve(args, invoke_tls=invoke_tls))
    else:
        uvloop.run(serve(args, invoke_tls=invoke_tls))


if __name__ == "__main__":
    main()
