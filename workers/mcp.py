"""`krt mcp`: the control plane as MCP tools (kruntimes.mcp), for an agent.

    krt mcp                              stdio: one local agent, with the CLI's credentials
                                         (client.json or the KRT_* variables)
    krt mcp --listen 127.0.0.1:8444      streamable HTTP over TLS at https://HOST:PORT/mcp; each
                                         request's bearer token is checked as the gateway checks
                                         it (--auth embedded: --token-file, --role-bindings)

An entry point, not a command of kruntimes.cli: over HTTP it authorizes with the gateway's auth
methods, which only the layer above the components may import. With the embedded platform's
state directory the serving certificate, token file and role bindings default to the gateway's
own (tls/, tokens.csv, rolebindings.yaml).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kruntimes.cli.main import explain
from kruntimes.mcp import errors
from kruntimes.mcp.access import EVERY_NAMESPACE, LocalAccess, Target, TokenAccess
from kruntimes.mcp.server import Platform, http_app, serve_stdio
from kruntimes.sdk import config as clientconfig
from kruntimes.sdk.client import Client

if TYPE_CHECKING:
    from kruntimes.gateway.auth.base import Authorizer


def parse_args(argv: list[str]) -> argparse.Namespace:
    from kruntimes.gateway.auth import methods as auth

    p = argparse.ArgumentParser(prog="krt mcp", description="Serve the kruntimes control plane as MCP tools.")
    p.add_argument(
        "--listen", metavar="HOST:PORT", help="serve streamable HTTP over TLS here (default: stdio)"
    )
    p.add_argument(
        "--cert", type=Path, help="--listen: serving certificate (default: the state dir's tls/tls.crt)"
    )
    p.add_argument("--key", type=Path, help="--listen: serving key (default: the state dir's tls/tls.key)")
    p.add_argument("--ready-file", type=Path, help="--listen: write {url} here once serving")
    p.add_argument("--log-level", default="warning")
    auth.add_arguments(p)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 0
    # logs go to stderr: over stdio, stdout is the protocol's
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(), format="%(name)s %(message)s")
    try:
        config = clientconfig.load()
        if args.listen is None:
            asyncio.run(_stdio(config))
        else:
            asyncio.run(_http(args, config))
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        code, message = explain(e)
        print(f"krt mcp: {message}", file=sys.stderr)
        return code
    return 0


async def _stdio(config: clientconfig.ClientConfig) -> None:
    platform = Platform(Client(config, creator_kind="mcp"))
    try:
        await serve_stdio(platform, LocalAccess(config.identity))
    finally:
        await platform.close()


def _access(authorizer: Authorizer) -> TokenAccess:
    """The gateway's authorizer (its method and decision cache) as the tools' Access: the review
    names the exact Run or Function a tool acts on (kind, namespace, name), as the gateway's own
    review of an invocation does; the caller's token goes on with the call."""
    from kruntimes.gateway.auth.base import AuthError, Forbidden, Resource, bearer_token

    async def authorize(header: str | None, target: Target) -> tuple[str, str]:
        try:
            token = bearer_token(header)
            first, *more = target.verbs or ("get",)
            # each verb on the exact object (in a cluster, an access review for each)
            principal = await authorizer.authorize(token, _resource(target, first))
            for verb in more:
                await authorizer.authorize(token, _resource(target, verb))
        except Forbidden as e:
            if target.namespace == EVERY_NAMESPACE:
                raise errors.forbidden(
                    "not bound to every namespace (the admin's), as the host, queue and schedule tools "
                    "and a listing of every namespace need"
                ) from e
            if target.name:
                raise errors.forbidden(
                    f"not allowed on {target.kind} {target.namespace}/{target.name} (a binding to "
                    f"namespace {target.namespace!r}; in a cluster, {' and '.join(target.verbs)} on "
                    f"{target.kind}.kruntimes.io)"
                ) from e
            raise errors.forbidden(f"not bound to namespace {target.namespace!r}") from e
        except AuthError as e:
            raise errors.ToolError(type(e).__name__, str(e)) from e
        return principal.user, token

    def _resource(target: Target, verb: str) -> Resource:
        return Resource(namespace=target.namespace, name=target.name, run_uid="", kind=target.kind, verb=verb)

    return TokenAccess(authorize)


async def _http(args: argparse.Namespace, config: clientconfig.ClientConfig) -> None:
    import json

    import uvicorn

    from kruntimes.gateway.auth import methods as auth
    from kruntimes.gateway.auth.base import AuthError, Forbidden, Resource, bearer_token

    host, sep, port = args.listen.rpartition(":")
    if not sep or not port.isdigit():
        raise errors.ToolError("Usage", f"--listen {args.listen!r}: expected HOST:PORT")
    host = host.strip("[]")
    state = Path(config.stateDir)
    cert = args.cert or state / "tls" / "tls.crt"
    key = args.key or state / "tls" / "tls.key"
    if args.auth == "embedded":
        args.token_file = args.token_file or state / "tokens.csv"
        args.role_bindings = args.role_bindings or state / "rolebindings.yaml"
    args.kubernetes_identify = True  # in a cluster, the audit and creators name the caller
    checker = auth.authorizer_from(args)
    access = _access(checker)
    platform = Platform(Client(config, creator_kind="mcp"))

    async with http_app(platform, access, host=host) as app:

        async def guarded(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
            """Every request needs a token the authorizer knows (bound anywhere or not): 401
            before the MCP layer reads it otherwise."""
            if scope["type"] == "http":
                header = dict(scope["headers"]).get(b"authorization")
                try:
                    token = bearer_token(header.decode("latin-1") if header is not None else None)
                    await checker.authorize(token, Resource(namespace=EVERY_NAMESPACE, name="", run_uid=""))
                except Forbidden:
                    pass
                except AuthError as e:
                    body = json.dumps({"reason": type(e).__name__, "message": str(e)}).encode()
                    await send(
                        {
                            "type": "http.response.start",
                            "status": 401,
                            "headers": [
                                (b"content-type", b"application/json"),
                                (b"www-authenticate", b"Bearer"),
                            ],
                        }
                    )  # type: ignore[operator]
                    await send({"type": "http.response.body", "body": body})  # type: ignore[operator]
                    return
            await app(scope, receive, send)

        server = uvicorn.Server(
            uvicorn.Config(
                guarded,
                host=host,
                port=int(port),
                ssl_certfile=str(cert),
                ssl_keyfile=str(key),
                log_level=args.log_level,
                lifespan="off",
                timeout_keep_alive=30,
                limit_concurrency=256,
            )
        )
        serving = asyncio.ensure_future(server.serve())
        try:
            while not server.started:
                if serving.done():
                    await serving
                    return
                await asyncio.sleep(0.05)
            bound = server.servers[0].sockets[0].getsockname()[1]
            url = f"https://{host if ':' not in host else f'[{host}]'}:{bound}/mcp"
            if args.ready_file is not None:
                args.ready_file.write_text(json.dumps({"url": url}))
            print(f"krt mcp: serving {url}", file=sys.stderr, flush=True)
            await serving
        finally:
            await platform.close()
            await checker.close()
