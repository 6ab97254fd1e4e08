"""`krt gateway` / `python -m gateway`: the HTTPS invoke gateway."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
from pathlib import Path

from gateway.auth import (
    Authorizer,
    CachingAuthorizer,
    EmbeddedAuthorizer,
    KubernetesAuthorizer,
    RoleBindings,
    TokenFile,
)
from gateway.server import Gateway, GatewayOptions
from kruntimes import logs
from kruntimes.assignments import AssignmentError, Verifier
from kruntimes.pki import PeerTLS, PeerTLSError, Role

GC_THRESHOLDS = (20_000, 50, 100)


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
    p.add_argument("--temporal-address", help="for the known-Runs view (503 rather than 404 on a miss)")
    p.add_argument("--namespace", default="default", help="Temporal namespace")
    p.add_argument("--ready-file", type=Path, help="write {url, heartbeatAddress, pid} here once serving")
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


def authorizer_from(args: argparse.Namespace) -> Authorizer:
    inner: Authorizer
    if args.auth == "kubernetes":
        if not args.kubernetes_api:
            raise SystemExit("krt gateway: --auth kubernetes needs --kubernetes-api")
        ca = str(args.kubernetes_ca) if args.kubernetes_ca else None
        inner = KubernetesAuthorizer(args.kubernetes_api, ca_file=ca)
    else:
        if not args.token_file or not args.role_bindings:
            raise SystemExit("krt gateway: --auth embedded needs --token-file and --role-bindings")
        inner = EmbeddedAuthorizer(TokenFile(args.token_file), RoleBindings.load(args.role_bindings))
    return CachingAuthorizer(inner)


async def serve(args: argparse.Namespace, *, invoke_tls: bool = True) -> None:
    try:
        peer_tls = PeerTLS(args.peer_tls, role=Role.GATEWAY)
        assignments = Verifier.load(args.assignment_public_key)
    except (PeerTLSError, AssignmentError) as e:
        raise SystemExit(f"krt gateway: {e}") from None
    temporal = None
    if args.temporal_address:
        from kruntimes.temporal import connect

        temporal = await connect(args.temporal_address, args.namespace)
    host, _, port = args.listen.rpartition(":")
    gateway = Gateway(
        GatewayOptions(
            listen_host=host,
            listen_port=int(port),
            heartbeat_listen=args.heartbeat_listen,
            cert_file=args.cert,
            key_file=args.key,
            authorizer=authorizer_from(args),
            temporal=temporal,
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
        tmp = args.ready_file.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"url": url, "heartbeatAddress": gateway.heartbeat_address, "pid": os.getpid()})
        )
        tmp.replace(args.ready_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
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
