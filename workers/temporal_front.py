"""`python -m kruntimes.workers.temporal_front`: the front of the embedded platform's Temporal dev
server (the `front` component of `krt up`), on 127.0.0.1.

    --listen      the Temporal frontend, mutual TLS: a client certificate of --client-ca is
                  required during the handshake; the bytes go to the dev server's frontend socket
                  (kruntimes.temporal.front)
    --ui-listen   HTTPS: the Temporal UI for the owner's session (`krt ui`), and the codec endpoint
                  (/codec) for that session or a bearer token of the token file
                  (kruntimes.gateway.ui_front)

The dev server itself is in a network namespace of its own, reachable only through the Unix
sockets of the state directory (kruntimes.workers.embedded.hidden_temporal). Writes its ready file
({"address", "uiUrl"}) once both listen; stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import ssl
from pathlib import Path

from kruntimes.gateway.auth import TokenFile, TokenFileError
from kruntimes.gateway.codec_server import CodecOptions
from kruntimes.gateway.ui_front import UiFront
from kruntimes.system import logs
from kruntimes.system.serving import stop_event, write_ready_file
from kruntimes.temporal.codec import CodecError, EncryptionCodec, Keyring
from kruntimes.temporal.front import Forwarder, front_context, unix_address, unix_upstream

log = logging.getLogger("temporal.front")
MAX_LOGIN_KEY_BYTES = 4096


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kruntimes.workers.temporal_front", description=__doc__)
    p.add_argument("--listen", required=True, help="127.0.0.1:PORT of the Temporal frontend (mutual TLS)")
    p.add_argument("--ui-listen", required=True, help="127.0.0.1:PORT of the UI and the codec endpoint")
    p.add_argument("--frontend-socket", type=Path, required=True)
    p.add_argument("--ui-socket", type=Path, required=True)
    p.add_argument("--cert", type=Path, required=True, help="the front's serving certificate (PEM)")
    p.add_argument("--key", type=Path, required=True)
    p.add_argument("--client-ca", type=Path, required=True, help="the CA of the owner's client certificate")
    p.add_argument("--login-key-file", type=Path, required=True, help="the key `krt ui` mints tickets with")
    p.add_argument("--codec-keys", type=Path, required=True)
    p.add_argument("--token-file", type=Path, required=True)
    p.add_argument("--ready-file", type=Path)
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


def _split(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host, int(port)


def _ui_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


def _login_key(path: Path) -> str:
    with path.open("rb") as f:
        key = f.read(MAX_LOGIN_KEY_BYTES + 1).decode().strip()
    if not key or len(key) > MAX_LOGIN_KEY_BYTES:
        raise SystemExit(f"temporal front: {path} holds no usable login key")
    return key


async def serve(args: argparse.Namespace) -> None:
    try:
        codec = CodecOptions(
            codec=EncryptionCodec(Keyring.load(args.codec_keys)), tokens=TokenFile(args.token_file)
        )
    except (CodecError, TokenFileError) as e:
        raise SystemExit(f"temporal front: {e}") from None
    host, port = _split(args.listen)
    sock = socket.create_server((host, port), backlog=1024)
    grpc_front = Forwarder(
        sock,
        unix_upstream(args.frontend_socket),
        tls=front_context(cert=args.cert, key=args.key, client_ca=args.client_ca),
        name="frontend",
    )
    ui_host, ui_port = _split(args.ui_listen)
    ui = UiFront(
        host=ui_host,
        port=ui_port,
        ssl_context=_ui_context(args.cert, args.key),
        ui_socket=unix_address(args.ui_socket),
        login_key=_login_key(args.login_key_file),
        codec=codec,
    )
    await grpc_front.start()
    url = await ui.start()
    address = f"{host}:{sock.getsockname()[1]}"
    log.info("temporal front serving", extra={"address": address, "ui": url})
    if args.ready_file:
        write_ready_file(args.ready_file, address=address, uiUrl=url)
    await stop_event().wait()
    await ui.stop()
    await grpc_front.close()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logs.setup(args.log_level)
    try:
        # uvloop when installed: each forwarded byte costs less CPU on it than on asyncio's loop
        import uvloop
    except ImportError:
        asyncio.run(serve(args))
    else:
        uvloop.run(serve(args))


if __name__ == "__main__":
    main()
