"""Which platform roles may call which method of a grpc.aio server.

`PeerAuthorization(allowed, default=...)` is a server interceptor: before a handler runs it reads
the caller's identity from its client certificate (the server's credentials already required one
of the platform CA) and refuses the call unless the method's roles include the caller's role:
UNAUTHENTICATED without a platform identity, PERMISSION_DENIED (reason PermissionDenied) for a
role the method does not allow. A method absent from `allowed` gets `default` — so a method added
later is closed to every role but the default's until it is listed.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import grpc

from kruntimes.pki.identity import Identity, IdentityError, Role
from kruntimes.wire.reasons import HostReason, trailer

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]


def peer_identity(context: Context) -> Identity | None:
    """The platform identity of the caller's certificate (grpc reads its one SPIFFE URI SAN), or
    None when it has none."""
    ids = list(context.auth_context().get("peer_spiffe_id") or ())
    if len(ids) != 1:
        return None
    try:
        return Identity.parse(ids[0].decode("utf-8", "replace"))
    except IdentityError:
        return None


async def authorize(context: Context, *, roles: frozenset[Role], method: str) -> Identity:
    """The caller's identity if its role is one of `roles`; else the call is aborted."""
    identity = peer_identity(context)
    if identity is None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "no platform identity")
        raise AssertionError("unreachable: abort raises")
    if identity.role not in roles:
        log.warning("refused a call", extra={"method": method, "peer": str(identity)})
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            f"a {identity.role} may not call {method}",
            trailer(HostReason.PERMISSION_DENIED),
        )
        raise AssertionError("unreachable: abort raises")
    return identity


if TYPE_CHECKING:
    Handler = grpc.RpcMethodHandler[Any, Any]
else:
    Handler = grpc.RpcMethodHandler


def _guarded(handler: Handler, roles: frozenset[Role], method: str) -> Handler:
    """`handler` with the role check before its behaviour (grpc.aio behaviours are coroutines or
    async generators; the stubs type them as the sync server's)."""
    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        unary: Any = handler.unary_unary

        async def unary_unary(request: Any, context: Context) -> Any:
            await authorize(context, roles=roles, method=method)
            return await unary(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **kwargs)
    if handler.stream_unary is not None:
        collect: Any = handler.stream_unary

        async def stream_unary(requests: AsyncIterator[Any], context: Context) -> Any:
            await authorize(context, roles=roles, method=method)
            return await collect(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **kwargs)
    streaming: Any = handler.unary_stream or handler.stream_stream
    assert streaming is not None, "a method handler has one behaviour"
    if inspect.isasyncgenfunction(streaming):  # answers yielded

        async def generate(request: Any, context: Context) -> AsyncIterator[Any]:
            await authorize(context, roles=roles, method=method)
            async for answer in streaming(request, context):
                yield answer

        behaviour: Callable[..., Any] = generate
    else:  # answers written with context.write

        async def write(request: Any, context: Context) -> Any:
            await authorize(context, roles=roles, method=method)
            return await streaming(request, context)

        behaviour = write
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(behaviour, **kwargs)
    return grpc.stream_stream_rpc_method_handler(behaviour, **kwargs)


class PeerAuthorization(grpc.aio.ServerInterceptor):
    """Allows each method to the roles `allowed` names, every other method to `default`'s."""

    def __init__(self, allowed: Mapping[str, Iterable[Role]], *, default: Iterable[Role]) -> None:
        self.allowed = {method: frozenset(roles) for method, roles in allowed.items()}
        self.default = frozenset(default)
        self._guarded: dict[str, Handler] = {}

    def roles(self, method: str) -> frozenset[Role]:
        return self.allowed.get(method, self.default)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        method = handler_call_details.method
        guarded = self._guarded.get(method)
        if guarded is not None:
            return guarded
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        guarded = self._guarded[method] = _guarded(handler, self.roles(method), method)
        return guarded
