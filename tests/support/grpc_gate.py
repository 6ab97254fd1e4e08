"""A gRPC front for a test's Temporal clients: every call forwarded as it came (unary, its bytes
untouched, its metadata and deadline kept) to the dev server, until the test revokes a method (or
its requests that match): from then on those calls are answered PERMISSION_DENIED, the ones in
flight included, as an authorizer in front of Temporal answers a client whose access it revoked.
`restore` lets them through again.

Temporal's WorkflowService has only unary methods, so a unary handler forwards all of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc
import grpc.aio

MAX_MESSAGE_BYTES = 128 * 1024 * 1024  # Temporal's own limit for a history page
DENIED = "access revoked by the test's gRPC front"
# Metadata gRPC sets itself on the outgoing call: forwarding it again would be refused.
_OWN_KEYS = ("user-agent", "te", "content-type")

_Unary = Callable[[bytes, grpc.aio.ServicerContext[bytes, bytes]], Awaitable[bytes]]


class GrpcGate:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.address = ""
        self.denied: dict[str, Callable[[bytes], bool]] = {}  # method → which of its requests
        self.answered_denied = 0  # calls answered PERMISSION_DENIED
        self._in_flight: dict[str, dict[asyncio.Task[bytes], bytes]] = {}  # call → its request
        self._revoked: set[asyncio.Task[bytes]] = set()  # calls in flight that `deny` ended
        self._channel: grpc.aio.Channel | None = None
        self._server: grpc.aio.Server | None = None

    async def start(self) -> str:
        """Listen on a port of 127.0.0.1 picked now; its address."""
        limits = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
        self._channel = grpc.aio.insecure_channel(self.upstream, options=limits)
        self._server = grpc.aio.server(options=limits)
        self._server.add_generic_rpc_handlers([_Handler(self)])
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        self.address = f"127.0.0.1:{port}"
        return self.address

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
        if self._channel is not None:
            await self._channel.close()

    def deny(self, method: str, matching: Callable[[bytes], bool] = lambda _: True) -> None:
        """Answer `method` (e.g. PollActivityTaskQueue) PERMISSION_DENIED when its request (its
        bytes) is `matching`, the calls in flight too."""
        self.denied[method] = matching
        for call, request in self._in_flight.get(method, {}).items():
            if matching(request):
                self._revoked.add(call)
                call.cancel()

    def restore(self, method: str) -> None:
        self.denied.pop(method, None)

    async def forward(
        self, path: str, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes:
        method = path.rsplit("/", 1)[-1]
        rule = self.denied.get(method)
        if rule is not None and rule(request):
            await self._deny(context)
        assert self._channel is not None
        metadata = tuple(
            (k, v)
            for k, v in context.invocation_metadata() or ()
            if not k.startswith((":", "grpc-")) and k not in _OWN_KEYS
        )
        remaining = context.time_remaining()
        call = self._channel.unary_unary(path)(
            request, metadata=metadata, timeout=remaining if remaining and remaining < 3600 else None
        )
        task: asyncio.Task[bytes] = asyncio.ensure_future(call)
        calls = self._in_flight.setdefault(method, {})
        calls[task] = request
        try:
            return await task
        except asyncio.CancelledError:
            if task not in self._revoked:
                raise  # the client went away: the call ends with it
            await self._deny(context)
            raise  # unreachable: abort raises
        except grpc.aio.AioRpcError as e:
            trailing = tuple((k, v) for k, v in e.trailing_metadata() or () if k.endswith("-bin"))
            await context.abort(e.code(), e.details() or "", trailing_metadata=trailing)
            raise  # unreachable: abort raises
        finally:
            calls.pop(task, None)
            self._revoked.discard(task)
            task.cancel()

    async def _deny(self, context: grpc.aio.ServicerContext[bytes, bytes]) -> None:
        self.answered_denied += 1
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, DENIED)


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, gate: GrpcGate) -> None:
        self.gate = gate

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        path: str = handler_call_details.method  # type: ignore[attr-defined]
        gate = self.gate

        async def unary(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            return await gate.forward(path, request, context)

        # no (de)serializers: the bytes go through as they came
        return grpc.unary_unary_rpc_method_handler(unary)
