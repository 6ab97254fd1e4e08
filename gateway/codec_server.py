"""The codec server (`krt codec-server`; its entry point is workers/codec_server.py): the Temporal
codec server protocol over the kruntimes payload codec, so that people allowed to (the `temporal`
CLI's `--codec-endpoint`, the Temporal UI's data encoder) read the encrypted payloads of history
(kruntimes.temporal.codec) without holding the keys themselves.

    POST /decode   {"payloads": [Payload, ...]} in protobuf JSON → the same, decrypted
    POST /encode   {"payloads": [...]} → the same, encrypted with the active key
    OPTIONS        the CORS preflight of the configured UI origin (no credentials needed)

Rules:
- every POST carries `Authorization: Bearer <token>` (or, on the embedded platform's front,
  the owner's UI session: gateway/ui_front.py); the token is looked up in the token file
  (kruntimes.gateway.auth.TokenFile, the embedded gateway's format, reloaded on change) and its user must be
  in one of the allowed groups (default `admins`): 401 Unauthenticated without a known token, 403
  Forbidden outside the groups. Tokens are never logged; the log names the user.
- `X-Namespace` (which the CLI and the UI send) is accepted and logged; the keys are the
  platform's, for every namespace.
- a body is at most `--max-body-bytes` (413 PayloadTooLarge, refused before it is read whole)
  and holds at most MAX_PAYLOADS payloads (413, counted before any is parsed into a message or
  encrypted), and an answer is at most MAX_ANSWER_FACTOR times that bound (413): a body of many
  empty payloads would otherwise grow tenfold, encrypted, while other calls wait;
  a body that is not a JSON `Payloads` is 400 MalformedJSON; a payload the keys cannot decrypt is
  400 InvalidRequest. A payload written without the codec is returned as it is.
- CORS: only for the origins given with `--cors-origin` (the UI's, e.g. http://127.0.0.1:8233):
  `Access-Control-Allow-Origin` is that origin, with credentials, `Authorization`,
  `Content-Type` and `X-Namespace` allowed; a preflight from another origin is 403.
- HTTPS with `--cert/--key`; plain HTTP only on a loopback address. Connections are bounded as the
  gateway's are (gateway/listener.py: caps, header and body timeouts), and error answers are the
  gateway's ErrorBody with its catalogued reasons.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web
from google.protobuf import json_format
from temporalio.api.common.v1 import Payloads

from kruntimes.gateway.auth import Principal, TokenFile, bearer_token
from kruntimes.gateway.errors import BadRequest, Forbidden, GatewayError, PayloadTooLarge, Unauthenticated
from kruntimes.gateway.listener import HttpLimits, Listener, receive_body, send_continue
from kruntimes.gateway.metrics import GatewayMetrics
from kruntimes.gateway.replies import error_answer, gateway_error_answer, router_reason
from kruntimes.temporal.codec import CodecError, EncryptionCodec
from kruntimes.wire import headers
from kruntimes.wire.reasons import GatewayReason as R

log = logging.getLogger("gateway.codec")

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
# a history event, or a page of them as the UI and the CLI send, holds far fewer
MAX_PAYLOADS = 1024
MAX_ANSWER_FACTOR = 2
DEFAULT_GROUPS = ("admins",)
NAMESPACE_HEADER = "X-Namespace"
_ALLOW_HEADERS = f"{headers.AUTHORIZATION}, Content-Type, {NAMESPACE_HEADER}"
_PREFLIGHT_MAX_AGE_S = 600
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class CodecOptions:
    codec: EncryptionCodec
    tokens: TokenFile
    groups: tuple[str, ...] = DEFAULT_GROUPS
    cors_origins: frozenset[str] = field(default_factory=frozenset)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_payloads: int = MAX_PAYLOADS
    # who a request is without a token, if anyone (the embedded UI's session cookie)
    session: Callable[[web.Request], Principal | None] | None = None


def _cors(request: web.Request, origins: frozenset[str], response: web.StreamResponse) -> None:
    origin = request.headers.get("Origin")
    if origin is not None and origin in origins:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Allow-Credentials"] = "true"
        response.headers["Vary"] = "Origin"


def build_app(options: CodecOptions, limits: HttpLimits) -> web.Application:
    @web.middleware
    async def answers(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except GatewayError as err:
            response = gateway_error_answer(err, "")
        except web.HTTPException as exc:
            response = error_answer(
                status=exc.status, reason=router_reason(exc), message=exc.reason, invocation_id=""
            )
        except Exception:
            log.exception("unexpected error")
            response = gateway_error_answer(GatewayError("internal error"), "")
        _cors(request, options.cors_origins, response)
        return response

    def authorize(request: web.Request) -> Principal:
        if options.session is not None and (owner := options.session(request)) is not None:
            return owner
        token = bearer_token(request.headers.get(headers.AUTHORIZATION))
        principal = options.tokens.principal(token)
        if principal is None:
            raise Unauthenticated("unknown bearer token")
        if not set(principal.groups) & set(options.groups):
            raise Forbidden(f"user {principal.user!r} is in none of the groups allowed to use the codec")
        return principal

    async def payloads_of(request: web.Request) -> Payloads:
        if request.content_length is not None and request.content_length > options.max_body_bytes:
            raise PayloadTooLarge(f"the body is larger than {options.max_body_bytes} bytes")
        await send_continue(request)
        body = await receive_body(request, limits, max_bytes=options.max_body_bytes)
        malformed = BadRequest(
            'the body is not {"payloads": [...]} in protobuf JSON', reason=R.MALFORMED_JSON
        )
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            raise malformed from None
        listed = doc.get("payloads") if isinstance(doc, dict) else None
        if isinstance(listed, list) and len(listed) > options.max_payloads:
            raise PayloadTooLarge(
                f"a request holds at most {options.max_payloads} payloads, not {len(listed)}"
            )
        try:
            return json_format.ParseDict(doc, Payloads())
        except (json_format.ParseError, ValueError, TypeError, RecursionError):
            raise malformed from None

    def answer(payloads: Payloads) -> web.Response:
        body = json_format.MessageToJson(payloads, indent=None).encode()
        if len(body) > MAX_ANSWER_FACTOR * options.max_body_bytes:
            raise PayloadTooLarge(
                f"the answer would be larger than {MAX_ANSWER_FACTOR * options.max_body_bytes} bytes: "
                "send fewer payloads at a time"
            )
        return web.Response(body=body, content_type="application/json")

    async def decode(request: web.Request) -> web.Response:
        principal = authorize(request)
        sent = await payloads_of(request)
        try:
            decoded = Payloads(payloads=await options.codec.decode(sent.payloads))
        except CodecError as exc:
            raise BadRequest(f"a payload does not decrypt here: {exc}", reason=R.INVALID_REQUEST) from None
        log.info("decoded", extra=_who(request, principal, len(sent.payloads)))
        return answer(decoded)

    async def encode(request: web.Request) -> web.Response:
        principal = authorize(request)
        sent = await payloads_of(request)
        encoded = Payloads(payloads=await options.codec.encode(sent.payloads))
        log.info("encoded", extra=_who(request, principal, len(sent.payloads)))
        return answer(encoded)

    async def preflight(request: web.Request) -> web.Response:
        origin = request.headers.get("Origin")
        if origin is None or origin not in options.cors_origins:
            raise Forbidden("this origin may not call the codec server")
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Methods": "POST, OPTIONS",
                "Access-Control-Allow-Headers": _ALLOW_HEADERS,
                "Access-Control-Max-Age": str(_PREFLIGHT_MAX_AGE_S),
            },
        )

    app = web.Application(middlewares=[answers], client_max_size=options.max_body_bytes + 1)
    app.router.add_post("/decode", decode)
    app.router.add_post("/encode", encode)
    app.router.add_route("OPTIONS", "/decode", preflight)
    app.router.add_route("OPTIONS", "/encode", preflight)
    return app


def _who(request: web.Request, principal: Principal, count: int) -> dict[str, object]:
    namespace = request.headers.get(NAMESPACE_HEADER, "")[:256]
    return {"user": principal.user, "namespace": namespace, "payloads": count}


class CodecServer:
    def __init__(
        self,
        options: CodecOptions,
        *,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        limits: HttpLimits | None = None,
    ) -> None:
        self.options = options
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.limits = limits or HttpLimits()
        self.runner: web.AppRunner | None = None
        self.listener: Listener | None = None
        self.url = ""

    async def start(self) -> str:
        self.runner = web.AppRunner(
            build_app(self.options, self.limits), access_log=None, handle_signals=False
        )
        await self.runner.setup()
        assert self.runner.server is not None
        self.listener = Listener(
            host=self.host,
            port=self.port,
            ssl_context=self.ssl_context,
            limits=self.limits,
            metrics=GatewayMetrics(),
        )
        port = await self.listener.start(self.listener.protocol_factory(self.runner.server))
        scheme = "https" if self.ssl_context is not None else "http"
        self.url = f"{scheme}://{self.host}:{port}"
        return self.url

    async def stop(self) -> None:
        if self.listener is not None:
            self.listener.close()
        if self.runner is not None:
            await self.runner.cleanup()
