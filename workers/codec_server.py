"""`krt codec-server` / `python -m kruntimes.workers.codec_server`: the codec server's entry point.

Its flags and environment (KRT_CODEC_KEYS) read once; the server itself, its rules and its
answers are kruntimes.gateway.codec_server's.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import ssl
from pathlib import Path

from kruntimes.gateway.auth import TokenFile, TokenFileError
from kruntimes.gateway.codec_server import (
    DEFAULT_GROUPS,
    DEFAULT_MAX_BODY_BYTES,
    MAX_BODY_BYTES,
    CodecOptions,
    CodecServer,
)
from kruntimes.system import logs
from kruntimes.system.serving import stop_event, write_ready_file
from kruntimes.temporal.codec import CodecError, EncryptionCodec, Keyring

log = logging.getLogger("gateway.codec")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="krt codec-server",
        description="Serve the Temporal codec server protocol (/decode, /encode) with the platform's "
        "payload keys, to callers whose token is in an allowed group.",
    )
    p.add_argument("--listen", default="127.0.0.1:8081", help="address (port 0: pick one)")
    p.add_argument(
        "--cert", type=Path, help="serving certificate (PEM): HTTPS; without it, loopback HTTP only"
    )
    p.add_argument("--key", type=Path, help="serving key (PEM)")
    p.add_argument(
        "--codec-keys", type=Path, help="directory of payload encryption keys (default: KRT_CODEC_KEYS)"
    )
    p.add_argument("--token-file", type=Path, required=True, help='token,user,uid,"groups" CSV (mode 0600)')
    p.add_argument(
        "--allow-group",
        action="append",
        default=[],
        help=f"a group whose users may decode and encode (repeatable; default {', '.join(DEFAULT_GROUPS)})",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        help="an origin allowed to call from a browser, e.g. the Temporal UI's http://127.0.0.1:8233",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="the largest request body (default %(default)s)",
    )
    p.add_argument("--ready-file", type=Path, help="write {url, pid} here once serving")
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def options_from(args: argparse.Namespace, env: dict[str, str] | None = None) -> CodecOptions:
    env = dict(os.environ) if env is None else env
    keys = args.codec_keys or (Path(env["KRT_CODEC_KEYS"]) if env.get("KRT_CODEC_KEYS") else None)
    if keys is None:
        raise SystemExit("krt codec-server: --codec-keys (or KRT_CODEC_KEYS) names the key directory")
    if not 1024 <= args.max_body_bytes <= MAX_BODY_BYTES:
        raise SystemExit(f"krt codec-server: --max-body-bytes must be 1024 to {MAX_BODY_BYTES}")
    for origin in args.cors_origin:
        if not origin.startswith(("http://", "https://")) or origin.count("/") != 2:
            raise SystemExit(f"krt codec-server: --cors-origin takes scheme://host[:port], not {origin!r}")
    try:
        codec = EncryptionCodec(Keyring.load(keys.expanduser()))
        tokens = TokenFile(args.token_file)
    except (CodecError, TokenFileError) as e:
        raise SystemExit(f"krt codec-server: {e}") from None
    return CodecOptions(
        codec=codec,
        tokens=tokens,
        groups=tuple(args.allow_group) or DEFAULT_GROUPS,
        cors_origins=frozenset(args.cors_origin),
        max_body_bytes=args.max_body_bytes,
    )


def ssl_context_from(args: argparse.Namespace, host: str) -> ssl.SSLContext | None:
    if (args.cert is None) != (args.key is None):
        raise SystemExit("krt codec-server: --cert and --key go together")
    if args.cert is None:
        if not _loopback(host):
            raise SystemExit("krt codec-server: plain HTTP only on a loopback address; give --cert and --key")
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(args.cert, args.key)
    except (OSError, ssl.SSLError) as e:
        raise SystemExit(f"krt codec-server: cannot load the serving certificate: {e}") from None
    return context


async def serve(args: argparse.Namespace) -> None:
    host, _, port = args.listen.rpartition(":")
    server = CodecServer(
        options_from(args), host=host, port=int(port), ssl_context=ssl_context_from(args, host)
    )
    url = await server.start()
    log.info("codec server serving", extra={"url": url})
    if args.ready_file:
        write_ready_file(args.ready_file, url=url)
    await stop_event().wait()
    await server.stop()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logs.setup(args.log_level)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
