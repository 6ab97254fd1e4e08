"""The raw chain that bench/invoke.py measures the gateway against: HTTPS → grpc.aio → pipe → echo.

    python bench/_invoke_chain.py grpc --children 32 [--uvloop] --ready-file PATH
    python bench/_invoke_chain.py http --upstream HOST:PORT --cert C --key K [--uvloop] --ready-file PATH

`grpc`: a grpc.aio server with one unary method, /bench.Chain/Invoke (bytes in, bytes out), whose
handler takes a free warm child (bench/_invoke_child.py, started up front, one invocation at a
time each, like a function process), writes the request to its stdin as a length-prefixed frame
and answers with the frame it echoes on stdout.

`http`: an aiohttp HTTPS server (keep-alive) whose one route, POST /invoke, forwards the body
over one grpc.aio channel opened at start-up and answers with the reply.

No authentication, no validation, no logging: the naive chain, the floor a gateway is held to.
The event loop is asyncio unless --uvloop. Once serving, each writes {"pid", "address"} to the
ready file (the http server's address is its https:// URL); SIGTERM or SIGINT stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import sys
from pathlib import Path
from typing import Any

import grpc
from _benchlib import wait_for_signal, write_ready

SERVICE = "bench.Chain"
METHOD = "Invoke"
FULL_METHOD = f"/{SERVICE}/{METHOD}"
CHILD_SCRIPT = Path(__file__).resolve().with_name("_invoke_child.py")
CALL_TIMEOUT_S = 10.0


class Child:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc = proc
        self.stdin = proc.stdin
        self.stdout = proc.stdout

    async def call(self, body: bytes) -> bytes:
        self.stdin.write(len(body).to_bytes(4, "big") + body)
        await self.stdin.drain()
        size = int.from_bytes(await self.stdout.readexactly(4), "big")
        return await self.stdout.readexactly(size)


async def serve_grpc(args: argparse.Namespace) -> None:
    children: list[Child] = []
    for _ in range(args.children):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(CHILD_SCRIPT), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        children.append(Child(proc))
    for child in children:  # warm: each has answered once before the server says it is ready
        if await child.call(b"{}") != b"{}":
            raise SystemExit("a chain child answered something else")
    free: asyncio.LifoQueue[Child] = asyncio.LifoQueue()
    for child in children:
        free.put_nowait(child)

    async def invoke(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        child = await free.get()
        reply = await child.call(request)  # an error leaves the child out of the pool (desynced)
        free.put_nowait(child)
        return reply

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    handler = grpc.method_handlers_generic_handler(
        SERVICE, {METHOD: grpc.unary_unary_rpc_method_handler(invoke)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(args.listen)
    if port == 0:
        raise OSError(f"cannot listen on {args.listen}")
    await server.start()
    write_ready(args.ready_file, address=f"{args.listen.rsplit(':', 1)[0]}:{port}")
    await wait_for_signal()
    await server.stop(1)
    for child in children:
        child.stdin.close()
    for child in children:
        try:
            await asyncio.wait_for(child.proc.wait(), 2)
        except TimeoutError:
            child.proc.kill()
            await child.proc.wait()


async def serve_http(args: argparse.Namespace) -> None:
    from aiohttp import web

    channel = grpc.aio.insecure_channel(args.upstream)
    await asyncio.wait_for(channel.channel_ready(), 10)
    upstream = channel.unary_unary(FULL_METHOD)  # bytes in, bytes out

    async def invoke(request: web.Request) -> web.Response:
        body = await request.read()
        reply = await upstream(body, timeout=CALL_TIMEOUT_S)
        return web.Response(body=reply, content_type="application/json")

    app = web.Application()
    app.router.add_post("/invoke", invoke)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.cert, args.key)
    host = args.listen.rsplit(":", 1)[0]
    site = web.TCPSite(runner, host, int(args.listen.rsplit(":", 1)[1]), ssl_context=context, backlog=1024)
    await site.start()
    port = int(runner.addresses[0][1])
    write_ready(args.ready_file, address=f"https://{host}:{port}")
    await wait_for_signal()
    await runner.cleanup()
    await channel.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["grpc", "http"])
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop instead of asyncio")
    parser.add_argument("--children", type=int, default=32, help="grpc: warm children (one call each)")
    parser.add_argument("--upstream", help="http: the grpc server's HOST:PORT")
    parser.add_argument("--cert", type=Path, help="http: serving certificate (PEM)")
    parser.add_argument("--key", type=Path, help="http: serving key (PEM)")
    args = parser.parse_args()
    if args.role == "http" and not (args.upstream and args.cert and args.key):
        parser.error("http needs --upstream, --cert and --key")
    serve = serve_grpc if args.role == "grpc" else serve_http
    if args.uvloop:
        import uvloop

        uvloop.run(serve(args))
    else:
        asyncio.run(serve(args))


if __name__ == "__main__":
    main()
