"""A TLS-terminating loopback gRPC proxy in front of a real Temporal dev server (whose `start-dev`
takes no TLS settings): every method's raw bytes are forwarded both ways, with the caller's
metadata, deadline, status and trailers.

    mode "tls"      server TLS only
    mode "mtls"     server TLS, and a client certificate from the test CA is required
    mode "api-key"  server TLS, and `authorization: Bearer <key>` is required (UNAUTHENTICATED else)

The proxy counts the calls it forwarded, so a test can tell that a client came through it.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from typing import Any

import grpc

from tests.temporal_tls.pki import Pki

# not forwarded: the proxy's own concern, or the transport's
_DROPPED = {"authorization", "user-agent", "te", "content-type"}


class _Forward(grpc.GenericRpcHandler):
    def __init__(self, proxy: TemporalProxy) -> None:
        self.proxy = proxy

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        proxy = self.proxy

        async def forward(
            requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[bytes]:
            metadata = tuple(context.invocation_metadata() or ())
            if proxy.api_key is not None and not proxy.authorized(metadata):
                proxy.refused += 1
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "a valid API key is required")
            forwarded = tuple(
                (key, value)
                for key, value in metadata
                if key not in _DROPPED and not key.startswith((":", "grpc-"))
            )
            assert proxy.upstream is not None
            call = proxy.upstream.stream_stream(method)(
                requests, metadata=forwarded, timeout=context.time_remaining()
            )
            proxy.forwarded += 1
            try:
                async for response in call:
                    yield response
                context.set_trailing_metadata(tuple(await call.trailing_metadata() or ()))
            except grpc.aio.AioRpcError as err:
                await context.abort(err.code(), err.details() or "", tuple(err.trailing_metadata() or ()))

        return grpc.stream_stream_rpc_method_handler(forward)


class TemporalProxy:
    def __init__(self, *, upstream: str, pki: Pki, mode: str, api_key: str | None = None) -> None:
        assert mode in ("tls", "mtls", "api-key")
        assert (mode == "api-key") == (api_key is not None)
        self.upstream_address = upstream
        self.pki = pki
        self.mode = mode
        self.api_key = api_key
        self.address = ""
        self.forwarded = 0
        self.refused = 0
        self.server: grpc.aio.Server | None = None
        self.upstream: grpc.aio.Channel | None = None

    def authorized(self, metadata: tuple[tuple[str, str | bytes], ...]) -> bool:
        expected = f"Bearer {self.api_key}".encode()
        for key, value in metadata:
            if key == "authorization":
                sent = value if isinstance(value, bytes) else value.encode()
                return hmac.compare_digest(sent, expected)
        return False

    async def start(self) -> str:
        self.upstream = grpc.aio.insecure_channel(self.upstream_address)
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers((_Forward(self),))
        credentials = grpc.ssl_server_credentials(
            [(self.pki.server.key.read_bytes(), self.pki.server.cert.read_bytes())],
            root_certificates=self.pki.ca.read_bytes() if self.mode == "mtls" else None,
            require_client_auth=self.mode == "mtls",
        )
        port = self.server.add_secure_port("127.0.0.1:0", credentials)
        await self.server.start()
        self.address = f"127.0.0.1:{port}"
        return self.address

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)
        if self.upstream is not None:
            await self.upstream.close()
