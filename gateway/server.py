"""One gateway process: the HTTPS invoke API and the heartbeat endpoint on one event loop.

HTTPS only: the listener is TLS, so a plain-HTTP request never gets an answer. Connections are
accepted and bounded by gateway/listener.py (caps, TLS handshake and header timeouts) and served
by aiohttp's HTTP/1.1 through its GatewayProtocol. Its serving certificate is the one clients
trust (`cert_file`, `key_file`); the internal hops — heartbeats from hosts, invokes to hosts — use
the gateway's platform certificate (`peer_tls`, a gateway identity of the platform CA), and routes
need assignments signed by the control plane (`assignments`, its public key). A gateway without
them does not start.
"""

from __future__ import annotations

import logging
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from kruntimes.gateway.app import ASYNC_INVOCATIONS, GatewayState, build_app
from kruntimes.gateway.async_invoke import DEFAULT_MAX_BACKLOG, DEFAULT_MAX_TARGET_BACKLOG, AsyncInvocations
from kruntimes.gateway.auth import Authorizer
from kruntimes.gateway.callback_origins import CallbackOrigins
from kruntimes.gateway.function_invoke import DEFAULT_WARMUP_S, Balancer
from kruntimes.gateway.heartbeats import HeartbeatServer
from kruntimes.gateway.invoke import Upstreams
from kruntimes.gateway.listener import HttpLimits, Listener
from kruntimes.gateway.metrics import GatewayMetrics
from kruntimes.gateway.routes import RouteCache
from kruntimes.gateway.visibility import Visibility
from kruntimes.gateway.wake import Waker
from kruntimes.pki import PeerTLS, Role
from kruntimes.pki.assignments import Verifier
from kruntimes.temporal.known_functions import KnownFunctions
from kruntimes.temporal.known_runs import KnownRuns

log = logging.getLogger(__name__)


class _NoRequestBytes(logging.Filter):
    """aiohttp logs a malformed request with the bytes it choked on (e.g. the first 100 bytes of an
    oversized `Authorization` header: a token); keep only the kind of error."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg = f"malformed HTTP request ({type(exc).__name__}, status {exc.code})"
            record.args = ()
            record.exc_info = record.exc_text = None
        return True


# aiohttp's server errors go here instead of `aiohttp.server`, through the filter above
http_log = logging.getLogger("gateway.http")
http_log.addFilter(_NoRequestBytes())


@dataclass
class GatewayOptions:
    listen_host: str
    listen_port: int  # 0: pick one
    heartbeat_listen: str  # e.g. 127.0.0.1:0
    cert_file: Path
    key_file: Path
    authorizer: Authorizer
    # the known-Runs and known-Functions views, and a Function's wake signal (scale from zero)
    temporal: Visibility | None = None
    known_refresh_s: float = 2.0
    limits: HttpLimits = field(default_factory=HttpLimits)
    extra: dict[str, object] = field(default_factory=dict)
    # required: the gateway's platform certificate and the assignment public key
    peer_tls: PeerTLS | None = None
    assignments: Verifier | None = None
    # False sends invokes to hosts' invoke ports in plaintext: only the invoke bench's baseline
    invoke_tls: bool = True
    # how long a Function this gateway never saw answers 503, not 404 (hosts not heard from yet)
    function_warmup_s: float = DEFAULT_WARMUP_S
    # async invocations' backlog bounds: Queued invocations of one target, of one namespace
    max_async_target_backlog: int = DEFAULT_MAX_TARGET_BACKLOG
    max_async_backlog: int = DEFAULT_MAX_BACKLOG
    # the origins a per-request callback URL may name, per namespace (None: none anywhere)
    callback_origins: CallbackOrigins | None = None


class GatewayConfigError(Exception):
    """The gateway cannot start as configured (e.g. without its platform certificate)."""


def server_ssl_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


class Gateway:
    def __init__(self, options: GatewayOptions) -> None:
        if options.peer_tls is None or options.assignments is None:
            raise GatewayConfigError("a gateway needs its platform certificate and the assignment public key")
        if options.peer_tls.identity.role is not Role.GATEWAY:
            raise GatewayConfigError(f"the gateway's certificate names {options.peer_tls.identity}")
        self.options = options
        self.routes = RouteCache(verifier=options.assignments)
        self.known = KnownRuns(options.temporal, refresh_s=options.known_refresh_s)
        self.upstreams = Upstreams(tls=options.peer_tls, invoke_tls=options.invoke_tls)
        self.metrics = GatewayMetrics()
        self.balancer = Balancer(self.routes, self.metrics)  # a Function's replicas
        self.known_functions = KnownFunctions(options.temporal, refresh_s=options.known_refresh_s)
        self.waker = Waker(options.temporal, metrics=self.metrics) if options.temporal is not None else None
        if self.waker is not None:
            self.balancer.use_temporal(self.known_functions, self.waker)
        self.heartbeats = HeartbeatServer(
            self.routes,
            options.heartbeat_listen,
            tls=options.peer_tls,
            balancer=self.balancer,
            known=self.known,  # async attempts (gateway/dispatch.py) share the sync invoke's view
            upstreams=self.upstreams,
        )
        self.runner: web.AppRunner | None = None
        self.listener: Listener | None = None
        self.async_invocations: AsyncInvocations | None = None  # once started
        self.url = ""

    async def start(self) -> str:
        heartbeat_address = await self.heartbeats.start()
        self.known.start()
        self.known_functions.start()
        state = GatewayState(
            routes=self.routes,
            known=self.known,
            authorizer=self.options.authorizer,
            upstreams=self.upstreams,
            metrics=self.metrics,
            ready=lambda: self.heartbeats.server is not None,
            limits=self.options.limits,
            balancer=self.balancer,
            temporal=self.options.temporal,
            max_async_target_backlog=self.options.max_async_target_backlog,
            max_async_backlog=self.options.max_async_backlog,
            callback_origins=self.options.callback_origins,
        )
        self.balancer.warm_until = time.monotonic() + self.options.function_warmup_s
        app = build_app(state)
        self.async_invocations = app[ASYNC_INVOCATIONS]
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False, logger=http_log)
        await self.runner.setup()
        assert self.runner.server is not None
        self.listener = Listener(
            host=self.options.listen_host,
            port=self.options.listen_port,
            ssl_context=server_ssl_context(self.options.cert_file, self.options.key_file),
            limits=self.options.limits,
            metrics=self.metrics,
        )
        port = await self.listener.start(self.listener.protocol_factory(self.runner.server))
        self.url = f"https://{self.options.listen_host}:{port}"
        log.info("gateway serving", extra={"url": self.url, "heartbeats": heartbeat_address})
        return self.url

    @property
    def heartbeat_address(self) -> str:
        return self.heartbeats.address

    async def stop(self) -> None:
        if self.listener is not None:
            self.listener.close()
        if self.runner is not None:
            await self.runner.cleanup()
        await self.known.stop()
        await self.known_functions.stop()
        if self.waker is not None:
            await self.waker.stop()
        if self.options.temporal is not None:
            await self.options.temporal.close()
        await self.heartbeats.stop()
        await self.upstreams.close()
        await self.options.authorizer.close()
