"""`krt gateway` / `python -m kruntimes.workers.gateway`: the HTTPS invoke gateway's entry point.

Temporal is optional here: with `--temporal-address` (or KRT_TEMPORAL_ADDRESS) the gateway keeps
the known-Runs view (a route-cache miss for a Run that exists answers 503, not 404), connecting
with the shared --temporal-* flags (TLS, mTLS, API key file; kruntimes.temporal.connect). It lists
RunWorkflows and FunctionWorkflows, and signals a FunctionWorkflow `wake` in the background when it
holds an invocation of a Function without a Ready replica (scale from zero); the sync invoke path
never awaits Temporal. Async invocations (`Prefer: respond-async`, gateway/async_invoke.py) start
and read InvocationWorkflows there, their payloads sealed with the workers' codec keys
(`--codec-keys`, or KRT_CODEC_KEYS); without Temporal they are answered 503. How invokes are
authorized is the auth method `--auth` names, with its own flags (kruntimes.gateway.auth.methods).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
from pathlib import Path
from typing import NamedTuple

from kruntimes.gateway.async_invoke import DEFAULT_MAX_BACKLOG, DEFAULT_MAX_TARGET_BACKLOG
from kruntimes.gateway.auth import methods as auth
from kruntimes.gateway.auth.base import AuthConfigError, Authorizer
from kruntimes.gateway.callback_origins import CallbackOrigins, OriginsError
from kruntimes.gateway.listener import HttpLimits
from kruntimes.gateway.server import Gateway, GatewayOptions
from kruntimes.gateway.visibility import Visibility, VisibilityError
from kruntimes.pki import PeerTLS, PeerTLSError, Role
from kruntimes.pki.assignments import AssignmentError, Verifier
from kruntimes.system import logs, malloc
from kruntimes.system.serving import stop_event, write_ready_file
from kruntimes.temporal import settings as temporal
from kruntimes.temporal.settings import TemporalSettings

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
    p.add_argument("--ready-file", type=Path, help="write {url, heartbeatAddress, pid} here once serving")
    p.add_argument("--log-level", default="info")
    limits = p.add_argument_group("connection limits (each connection and request is bounded)")
    default = HttpLimits()
    for flag in _LIMIT_FLAGS:
        limits.add_argument(
            flag.name,
            dest=flag.field,
            type=flag.parse,
            default=getattr(default, flag.field),
            metavar=flag.metavar,
            help=f"{flag.help} (default %(default)s)",
        )
    backlog = p.add_argument_group("async invocations (Prefer: respond-async)")
    backlog.add_argument(
        "--max-async-target-backlog",
        type=_positive,
        default=DEFAULT_MAX_TARGET_BACKLOG,
        metavar="N",
        help="Queued async invocations of one Run or Function at most; past it 429 AsyncBacklogFull "
        "(default %(default)s)",
    )
    backlog.add_argument(
        "--max-async-backlog",
        type=_positive,
        default=DEFAULT_MAX_BACKLOG,
        metavar="N",
        help="Queued async invocations of one namespace at most; past it 429 AsyncBacklogFull "
        "(default %(default)s)",
    )
    backlog.add_argument(
        "--callback-origins",
        type=Path,
        metavar="FILE",
        help="YAML of the origins each namespace's per-request callback URLs (X-Kruntime-Callback-URL) "
        "may name: `namespaces: {<namespace or *>: [https://host[:port], https://*.domain, ...]}`; "
        "read at start (a malformed entry refuses it); without it every per-request callback is 403",
    )
    auth.add_arguments(p)
    temporal.add_arguments(p)
    # no Temporal unless an address is given: the known-Runs view is optional
    p.set_defaults(temporal_address=None)
    return p.parse_args(argv)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


class _LimitFlag(NamedTuple):
    """One HttpLimits field and the flag that sets it."""

    field: str
    name: str
    parse: type[int] | type[float]
    metavar: str
    help: str


# Every HttpLimits field, in --help order: the flags are made from this, read back by field, and
# named in place of the field in a refusal.
_LIMIT_FLAGS = (
    _LimitFlag(
        "header_timeout_s",
        "--header-timeout",
        float,
        "S",
        "a new connection's TLS handshake, then each request's headers, must be complete "
        "within S seconds (on a kept-alive connection: from the request's first byte)",
    ),
    _LimitFlag(
        "body_timeout_s",
        "--body-timeout",
        float,
        "S",
        "a request body may arrive at any rate for its first S seconds ...",
    ),
    _LimitFlag(
        "body_min_rate",
        "--body-min-rate",
        int,
        "BYTES",
        "... and then at BYTES per second at least, on average (else 408 RequestBodyTimeout)",
    ),
    _LimitFlag(
        "idle_timeout_s",
        "--idle-timeout",
        float,
        "S",
        "a kept-alive connection with no request for S seconds is closed",
    ),
    _LimitFlag(
        "max_connections",
        "--max-connections",
        int,
        "N",
        "open connections at most; more are closed at accept (the open ones are served)",
    ),
    _LimitFlag(
        "max_connections_per_client",
        "--max-connections-per-client",
        int,
        "N",
        "open connections from one client address at most; more are closed at accept",
    ),
)


def limits_from(args: argparse.Namespace) -> HttpLimits:
    try:
        return HttpLimits(**{flag.field: getattr(args, flag.field) for flag in _LIMIT_FLAGS})
    except ValueError as e:
        message = str(e)
        # the longest field first: one field's name may begin another's
        for flag in sorted(_LIMIT_FLAGS, key=lambda f: len(f.field), reverse=True):
            message = message.replace(flag.field, flag.name)
        raise SystemExit(f"krt gateway: {message}") from None


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
    try:
        return auth.authorizer_from(args)
    except AuthConfigError as e:
        raise SystemExit(f"krt gateway: {e}") from None


async def connect_temporal(settings: TemporalSettings | None) -> Visibility | None:
    """The known-Runs view's reader of Temporal visibility (no Temporal SDK in the gateway)."""
    if settings is None:
        return None
    try:
        return await Visibility.connect(settings)
    except VisibilityError as e:  # unreachable, refused, unreadable TLS files
        raise SystemExit(f"krt gateway: cannot connect to Temporal at {settings.address}: {e}") from None


def callback_origins_from(args: argparse.Namespace) -> CallbackOrigins | None:
    """The --callback-origins file, or None (no per-request callback allowed anywhere)."""
    if args.callback_origins is None:
        return None
    try:
        return CallbackOrigins.load(args.callback_origins)
    except OriginsError as e:
        raise SystemExit(f"krt gateway: --callback-origins {e}") from None


async def serve(args: argparse.Namespace, *, invoke_tls: bool = True) -> None:
    origins = callback_origins_from(args)  # first: a malformed file refuses the start at once
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
            max_async_target_backlog=args.max_async_target_backlog,
            max_async_backlog=args.max_async_backlog,
            callback_origins=origins,
        )
    )
    url = await gateway.start()
    # Start-up objects never need collecting, and fewer, younger collections keep the tail short:
    # a full collection over the imported modules is a multi-millisecond pause for every request.
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    # Each host's snapshots and each visibility page are large and short-lived: what glibc keeps
    # of them after they are freed is given back (kruntimes.system.malloc)
    trimmer = malloc.Trimmer()
    trimmer.start()
    if args.ready_file:
        write_ready_file(args.ready_file, url=url, heartbeatAddress=gateway.heartbeat_address)
    try:
        await stop_event().wait()
    finally:
        trimmer.stop()
        await gateway.stop()


def main(argv: list[str] | None = None, *, invoke_tls: bool = True) -> None:
    """`invoke_tls=False` is the invoke bench's plaintext baseline (bench/invoke.py); no flag."""
    args = parse_args(argv)
    logs.setup(args.log_level)
    malloc.limit_arenas()  # before gRPC starts its threads
    try:
        # uvloop when installed: the same servers spend less CPU per request on it than on
        # asyncio's loop
        import uvloop
    except ImportError:
        asyncio.run(serve(args, invoke_tls=invoke_tls))
    else:
        uvloop.run(serve(args, invoke_tls=invoke_tls))


if __name__ == "__main__":
    main()
