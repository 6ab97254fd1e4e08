"""The embedded platform's Temporal UI and codec endpoint, for its owner only: the HTTPS half of
`krt up`'s front (kruntimes.workers.temporal_front), on 127.0.0.1.

    GET  /login?ticket=T    a ticket `krt ui` minted with the login key (kruntimes.temporal.
                            ui_login): a session cookie (HttpOnly, Secure, SameSite=Strict,
                            Path=/), then 303 to /; a used, expired or forged ticket is 401
    POST /codec/decode      the codec server protocol (gateway/codec_server.py) with the
    POST /codec/encode      platform's keys, for the session's cookie (the UI decodes in the
                            browser, same origin) or a bearer token of the token file in an allowed
                            group (the `temporal` CLI's codec auth); anyone else 401
    anything else           with the session: forwarded to the dev server's UI (its Unix socket,
                            the front's cookie taken off); without it: 401 and a page that says
                            to run `krt ui`, never the UI

A request must name this front in its Host header (127.0.0.1 or localhost, with the port): a page
of another site whose name resolves to 127.0.0.1 gets nothing. Connections are bounded as the
gateway's (gateway/listener.py); a request body is at most MAX_UI_BODY_BYTES, and an answer of the
UI is streamed through in chunks.
"""

from __future__ import annotations

import dataclasses
import logging
import ssl
from collections.abc import Awaitable, Callable
from http.cookies import CookieError, SimpleCookie

import aiohttp
from aiohttp import hdrs, web

from kruntimes.gateway.auth import Principal
from kruntimes.gateway.codec_server import CodecOptions, build_app
from kruntimes.gateway.listener import HttpLimits, Listener, receive_body
from kruntimes.gateway.metrics import GatewayMetrics
from kruntimes.temporal.ui_login import CODEC_PATH, Sessions, Tickets

log = logging.getLogger("gateway.ui_front")

COOKIE = "krt_ui_session"
MAX_UI_BODY_BYTES = 4 * 1024 * 1024
UPSTREAM_TIMEOUT_S = 120.0
CHUNK_BYTES = 64 * 1024
OWNER = Principal(user="owner", uid="", groups=())
# not forwarded either way: they describe one hop, not the request
_HOP = frozenset(
    h.lower()
    for h in (
        hdrs.CONNECTION,
        hdrs.KEEP_ALIVE,
        hdrs.PROXY_AUTHENTICATE,
        hdrs.PROXY_AUTHORIZATION,
        hdrs.TE,
        hdrs.TRAILER,
        hdrs.TRANSFER_ENCODING,
        hdrs.UPGRADE,
        hdrs.HOST,
        hdrs.CONTENT_LENGTH,
    )
)
_LOGIN_PAGE = (
    "<!doctype html><title>kruntimes: Temporal UI</title>"
    "<p>This Temporal UI is served to the platform's owner only. Run <code>krt ui</code> for a "
    "login link (each link works once, for a few minutes).</p>"
)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def session_of(request: web.BaseRequest) -> str | None:
    """The front's session cookie of a request, if it sent one."""
    raw = request.headers.get(hdrs.COOKIE)
    if not raw:
        return None
    try:
        jar: SimpleCookie = SimpleCookie(raw)
    except CookieError:
        return None
    morsel = jar.get(COOKIE)
    return morsel.value if morsel is not None else None


def _without_our_cookie(raw: str) -> str:
    kept = [part for part in raw.split(";") if part.strip().split("=", 1)[0] != COOKIE]
    return ";".join(kept).strip()


class UiFront:
    def __init__(
        self,
        *,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext,
        ui_socket: str,
        login_key: str,
        codec: CodecOptions,
        limits: HttpLimits | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.ui_socket = ui_socket
        self.tickets = Tickets(login_key)
        self.sessions = Sessions()
        self.codec = codec
        self.limits = limits or HttpLimits(max_connections=256, max_connections_per_client=256)
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._listener: Listener | None = None
        self._client: aiohttp.ClientSession | None = None

    def _owner(self, request: web.Request) -> Principal | None:
        return OWNER if self.sessions.valid(session_of(request)) else None

    def _app(self) -> web.Application:
        named = {f"127.0.0.1:{self.port}", f"localhost:{self.port}"}

        @web.middleware
        async def this_front_only(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.headers.get(hdrs.HOST, "").lower() not in named:
                return web.Response(status=421, text="this front serves 127.0.0.1 only\n")
            return await handler(request)

        app = web.Application(middlewares=[this_front_only], client_max_size=MAX_UI_BODY_BYTES)
        codec = build_app(dataclasses.replace(self.codec, session=self._owner), self.limits)
        app.add_subapp(CODEC_PATH, codec)
        app.router.add_get("/login", self._login)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        return app

    async def _login(self, request: web.Request) -> web.Response:
        ticket = request.query.get("ticket", "")
        if not self.tickets.redeem(ticket):
            log.info("a UI login with an unusable ticket was refused")
            return web.Response(
                status=401, text=_LOGIN_PAGE, content_type="text/html", headers={"Cache-Control": "no-store"}
            )
        answer = web.Response(
            status=303,
            # the ticket's URL is never sent on as a referrer, nor kept in a cache
            headers={hdrs.LOCATION: "/", "Cache-Control": "no-store", "Referrer-Policy": "no-referrer"},
        )
        answer.set_cookie(
            COOKIE, self.sessions.new(), httponly=True, secure=True, samesite="Strict", path="/"
        )
        log.info("the owner logged in to the UI")
        return answer

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if self._owner(request) is None:
            return web.Response(status=401, text=_LOGIN_PAGE, content_type="text/html")
        assert self._client is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        if hdrs.COOKIE in headers:
            headers[hdrs.COOKIE] = _without_our_cookie(headers[hdrs.COOKIE])
        # the answer is passed on as it comes: compressed only for a caller that asked for it
        headers.setdefault(hdrs.ACCEPT_ENCODING, "identity")
        body = await receive_body(request, self.limits, max_bytes=MAX_UI_BODY_BYTES)
        try:
            async with self._client.request(
                request.method,
                f"http://temporal-ui{request.rel_url}",
                headers=headers,
                data=body if body else None,
                allow_redirects=False,
            ) as upstream:
                answer = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for key, value in upstream.headers.items():
                    if key.lower() not in _HOP:
                        answer.headers.add(key, value)
                if upstream.content_length is not None:
                    answer.content_length = upstream.content_length
                await answer.prepare(request)
                async for chunk in upstream.content.iter_chunked(CHUNK_BYTES):
                    await answer.write(chunk)
                await answer.write_eof()
                return answer
        except (aiohttp.ClientError, TimeoutError) as e:
            log.warning("the dev server's UI did not answer: %s", type(e).__name__)
            return web.Response(status=502, text="the Temporal UI does not answer (krt status)\n")

    async def start(self) -> str:
        if self.port == 0:  # the Host check needs the port before the app is made
            raise ValueError("the UI front needs its port")
        self._client = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=self.ui_socket, limit=64),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=UPSTREAM_TIMEOUT_S),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self._listener = Listener(
            host=self.host,
            port=self.port,
            ssl_context=self.ssl_context,
            limits=self.limits,
            metrics=GatewayMetrics(),
        )
        self._runner = web.AppRunner(self._app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        assert self._runner.server is not None
        await self._listener.start(self._listener.protocol_factory(self._runner.server))
        self.url = f"https://{self.host}:{self.port}"
        return self.url

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._client is not None:
            await self._client.close()
