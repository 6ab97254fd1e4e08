"""A raw gRPC echo server, the baseline for bench/runtime_server.py (bytes in, bytes out, no proto).

    python bench/_echo_server.py --kind sync|aio|aio-uvloop --ready-file PATH --peer-tls DIR
        [--listen 127.0.0.1:0]

Serves one unary method, /bench.Echo/Echo, that returns its request, over mutual TLS with the
certificate directory given (client certificates of its CA required), as the runtime host serves.
Once serving it writes {"pid", "address", "kind"} to the ready file; SIGTERM or SIGINT stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import threading
from collections.abc import Awaitable, Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from _benchlib import wait_for_signal, write_ready

from kruntimes.pki import PeerTLS, Role

SERVICE = "bench.Echo"
METHOD = "Echo"
FULL_METHOD = f"/{SERVICE}/{METHOD}"
KINDS = ("sync", "aio", "aio-uvloop")
OPTIONS = [("grpc.so_reuseport", 0)]  # the runtime host sets the same


def _echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    return request


async def _echo_async(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    return request


def _handler(fn: Callable[..., bytes] | Callable[..., Awaitable[bytes]]) -> grpc.GenericRpcHandler:
    # request_deserializer / response_serializer left as None: the bytes pass through untouched
    return grpc.method_handlers_generic_handler(SERVICE, {METHOD: grpc.unary_unary_rpc_method_handler(fn)})


def _address(listen: str, port: int) -> str:
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    return f"{listen.rsplit(':', 1)[0]}:{port}"


def serve_sync(listen: str, ready_file: Path, workers: int, tls: PeerTLS) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=OPTIONS)
    server.add_generic_rpc_handlers((_handler(_echo),))
    address = _address(listen, server.add_secure_port(listen, tls.server_credentials()))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    write_ready(ready_file, address=address, kind="sync")
    stop.wait()
    server.stop(1).wait()


async def serve_aio(listen: str, ready_file: Path, kind: str, tls: PeerTLS) -> None:
    server = grpc.aio.server(options=OPTIONS)
    server.add_generic_rpc_handlers((_handler(_echo_async),))
    address = _address(listen, server.add_secure_port(listen, tls.server_credentials()))
    await server.start()
    write_ready(ready_file, address=address, kind=kind)
    await wait_for_signal()
    await server.stop(1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=64, help="sync: thread pool size")
    parser.add_argument("--peer-tls", type=Path, required=True, help="a host certificate directory")
    args = parser.parse_args(argv)
    tls = PeerTLS(args.peer_tls, role=Role.HOST)
    if args.kind == "sync":
        serve_sync(args.listen, args.ready_file, args.workers, tls)
    elif args.kind == "aio":
        asyncio.run(serve_aio(args.listen, args.ready_file, args.kind, tls))
    else:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve_aio(args.listen, args.ready_file, args.kind, tls))


if __name__ == "__main__":
    main()
