"""PeerAuthorization (kruntimes.pki.grpcauth) on a real grpc.aio server over mutual TLS: each
method for the roles it lists, and a method nobody listed — one added later, such as a host's
supervision stream — only for the default's roles."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from kruntimes.pki import PeerAuthorization, PeerTLS, Role, peer_identity
from kruntimes.runtime.service import ALLOWED_ROLES, DEFAULT_ROLES
from kruntimes.wire.reasons import reason_of
from tests.support.pki import CONTROL_PLANE, GATEWAY, TestPKI

SERVICE = "kruntimes.rpc.v1.FunctionRuntime"


async def _unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:  # type: ignore[type-arg]
    identity = peer_identity(context)
    return str(identity).encode()


async def _watch(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:  # type: ignore[type-arg]
    for i in range(3):
        yield str(i).encode()


async def _collect(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:  # type: ignore[type-arg]
    return b"".join([r async for r in requests])


@pytest.fixture
async def server(pki: TestPKI) -> AsyncIterator[str]:
    """The host's role table on a server whose methods answer with the caller's identity; WatchHost
    (a server stream) and Upload (a client stream) stand for methods the table does not list."""
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "HostInfo": grpc.unary_unary_rpc_method_handler(_unary),
            "InvokeFunction": grpc.unary_unary_rpc_method_handler(_unary),
            "WatchHost": grpc.unary_stream_rpc_method_handler(_watch),
            "Upload": grpc.stream_unary_rpc_method_handler(_collect),
        },
    )
    srv = grpc.aio.server(interceptors=[PeerAuthorization(ALLOWED_ROLES, default=DEFAULT_ROLES)])
    srv.add_generic_rpc_handlers((handler,))
    port = srv.add_secure_port("127.0.0.1:0", pki.host_tls("auth-0").server_credentials())
    await srv.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await srv.stop(None)


async def _call(
    pki: TestPKI, address: str, tls: PeerTLS, method: str
) -> bytes | list[bytes] | grpc.aio.AioRpcError:
    async with pki.aio_channel(address, as_=tls) as channel:
        path = f"/{SERVICE}/{method}"
        try:
            if method == "WatchHost":
                return [r async for r in channel.unary_stream(path)(b"", timeout=10)]
            if method == "Upload":

                async def requests() -> AsyncIterator[bytes]:
                    yield b"a"
                    yield b"b"

                answer: bytes = await channel.stream_unary(path)(requests(), timeout=10)
                return answer
            answer = await channel.unary_unary(path)(b"", timeout=10)
            return answer  # type: ignore[no-any-return]
        except grpc.aio.AioRpcError as err:
            return err


async def test_each_role_reaches_only_its_methods_and_unlisted_ones_are_the_control_planes(
    pki: TestPKI, server: str
) -> None:
    control, gateway, host = pki.control_plane, pki.gateway, pki.host_tls("auth-1")
    assert await _call(pki, server, control, "HostInfo") == CONTROL_PLANE.uri.encode()
    assert await _call(pki, server, gateway, "InvokeFunction") == GATEWAY.uri.encode()
    assert await _call(pki, server, control, "WatchHost") == [b"0", b"1", b"2"]
    assert await _call(pki, server, control, "Upload") == b"ab"
    for tls, method in [
        (gateway, "HostInfo"),
        (gateway, "WatchHost"),
        (gateway, "Upload"),
        (host, "WatchHost"),
        (host, "InvokeFunction"),
        (control, "InvokeFunction"),
    ]:
        err = await _call(pki, server, tls, method)
        assert isinstance(err, grpc.aio.AioRpcError), (tls.identity, method)
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED, (tls.identity, method)
        assert reason_of(err.trailing_metadata()) == "PermissionDenied"


async def test_an_unknown_method_is_unimplemented_for_everyone(pki: TestPKI, server: str) -> None:
    err = await _call(pki, server, pki.control_plane, "NoSuchMethod")
    assert isinstance(err, grpc.aio.AioRpcError) and err.code() == grpc.StatusCode.UNIMPLEMENTED


def test_the_hosts_table_names_only_invoke_and_health_for_other_roles() -> None:
    assert {Role.CONTROL_PLANE} == DEFAULT_ROLES
    assert {m: set(r) for m, r in ALLOWED_ROLES.items()} == {
        f"/{SERVICE}/InvokeFunction": {Role.GATEWAY},
        "/grpc.health.v1.Health/Check": set(Role),
        "/grpc.health.v1.Health/Watch": set(Role),
    }
