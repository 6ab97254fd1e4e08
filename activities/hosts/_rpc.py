"""The gRPC seam of the control plane to hosts: the one place a channel to a host is made, and
whether an endpoint is a serving Runtime Server, and which one.

Every channel to a host is mutual TLS with the control plane's platform certificate, set once by
the worker (`use_peer_tls`); the host must present a host certificate of the platform CA (a
particular host's when the caller names it). There is no plaintext channel to a host.

Errors::

    Exception
     ├── HostRpcError        .reason: EndpointInvalid | ProviderUnavailable | InvalidResponse
     └── NoPeerCertificate   host_channel before use_peer_tls (a wiring bug of the process)
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from enum import StrEnum

import grpc
from grpc_health.v1 import health_pb2

from kruntimes.contracts.providers import CreatedHost
from kruntimes.decisions.scheduling.failures import FailureReason
from kruntimes.pki import Identity, PeerTLS, Role
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc

# The stubs of grpc_health type HealthStub without its methods; call the method by name instead.
_HEALTH_CHECK = "/grpc.health.v1.Health/Check"
# Status codes that mean "this endpoint is not a Runtime Server", not "try again later".
_NOT_A_HOST = frozenset({grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.NOT_FOUND})


class HostRpcError(Exception):
    def __init__(self, reason: FailureReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class HostIdentity:
    host_id: str
    host_uid: str
    runtime: str


class NoPeerCertificate(RuntimeError):
    """No control-plane certificate was set for channels to hosts."""


_peer_tls: PeerTLS | None = None


def use_peer_tls(tls: PeerTLS) -> None:
    """The control plane's certificate (a control-plane identity) every channel to a host presents."""
    global _peer_tls
    if tls.identity.role is not Role.CONTROL_PLANE:
        raise ValueError(f"channels to hosts present a control-plane certificate, not {tls.identity}")
    _peer_tls = tls


def _tls() -> PeerTLS:
    if _peer_tls is None:
        raise NoPeerCertificate("no control-plane certificate for channels to hosts (use_peer_tls)")
    return _peer_tls


def credentials_generation() -> int:
    """Changes when the certificate files changed: a channel made before presents the old one."""
    tls = _tls()
    tls.refresh()
    return tls.generation


def host_channel(address: str, *, host: Identity | None = None) -> grpc.aio.Channel:
    """A gRPC channel to the Runtime Server at `address`: the one place the control plane makes
    one. Mutual TLS with the control plane's certificate; the server must be the host `host`, or
    without it any host of the platform."""
    tls = _tls()
    return grpc.aio.secure_channel(
        address, tls.channel_credentials(), options=tls.channel_options(host or Role.HOST)
    )


def gateway_channel(address: str) -> grpc.aio.Channel:
    """A gRPC channel to a gateway's heartbeat server at `address` (its GatewayLoad service):
    mutual TLS with the control plane's certificate; the server must be a gateway of the platform."""
    tls = _tls()
    return grpc.aio.secure_channel(
        address, tls.channel_credentials(), options=tls.channel_options(Role.GATEWAY)
    )


class Handshake(StrEnum):
    """What a TLS handshake as the control plane with the server at an address found."""

    Verified = "Verified"  # its certificate names the host asked for, signed by the platform CA
    Stranger = "Stranger"  # it is not that host: another certificate, or it does not speak TLS
    Refused = "Refused"  # nothing listens there
    Unfinished = "Unfinished"  # no answer in time, or the connection closed halfway


async def handshake(address: str, *, host: Identity, timeout_s: float) -> Handshake:
    """Shake hands with the server at ``address`` as a channel to `host` does (the control plane's
    certificate, the server verified as `host`), then close. A port is reused: once a host's
    process is gone, another server may listen at its address, and answers a TCP connection as
    the host did; only its certificate tells it apart. The server's answer to our certificate is
    not awaited (TLS 1.3 sends it after the handshake): a grpc call finds that."""
    check_address(address)
    name, _, port = address.rpartition(":")
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(
                name.strip("[]"),
                int(port),
                ssl=_tls().client_context(),
                server_hostname=host.dns_name,
                ssl_handshake_timeout=timeout_s,
            )
    except (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError):
        return Handshake.Unfinished  # closed halfway: a process on its way out, say
    except ssl.SSLError:  # the certificate (SSLCertVerificationError), or not TLS at all
        return Handshake.Stranger
    except ConnectionRefusedError:
        return Handshake.Refused
    except (TimeoutError, OSError):
        return Handshake.Unfinished
    writer.close()
    return Handshake.Verified


def check_address(address: str) -> str:
    """``host:port`` with a non-empty host and a port in 1..65535, or HostRpcError(EndpointInvalid)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise HostRpcError(FailureReason.EndpointInvalid, f"address {address!r:.80} is not host:port")
    return address


async def identify(address: str, *, timeout_s: float) -> HostIdentity:
    """Health SERVING, then HostInfo: the identity of the Runtime Server at ``address``."""
    check_address(address)
    try:
        async with host_channel(address) as channel:
            answer = await channel.unary_unary(
                _HEALTH_CHECK,
                request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                response_deserializer=health_pb2.HealthCheckResponse.FromString,
            )(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
            if answer.status != health_pb2.HealthCheckResponse.SERVING:
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
                raise HostRpcError(FailureReason.ProviderUnavailable, f"{address} is {status}")
            info = await pb_grpc.FunctionRuntimeStub(channel).HostInfo(
                pb.HostInfoRequest(), timeout=timeout_s
            )
    except grpc.aio.AioRpcError as e:
        reason = (
            FailureReason.InvalidResponse if e.code() in _NOT_A_HOST else FailureReason.ProviderUnavailable
        )
        raise HostRpcError(reason, f"{address}: {e.code().name}: {e.details()}") from e
    if not info.host_uid:
        raise HostRpcError(FailureReason.InvalidResponse, f"{address} reported no host uid")
    return HostIdentity(host_id=info.host_id, host_uid=info.host_uid, runtime=info.runtime)


async def serves(host: CreatedHost, *, timeout_s: float) -> bool:
    """The probe every provider shares: serving, and still the incarnation ``host`` names."""
    try:
        identity = await identify(host.address, timeout_s=timeout_s)
    except HostRpcError:
        return False
    return identity.host_uid == host.hostUid


async def stop_registrations(address: str, *, host_uid: str, timeout_s: float) -> bool:
    """Tell the host at ``address`` (incarnation ``host_uid``) to take no registration and no task
    from now on (FenceHost): True once it acknowledged, False when it is a host without the call
    (older than the fence). HostRpcError when it cannot be reached or is another incarnation."""
    check_address(address)
    try:
        async with host_channel(address) as channel:
            stub = pb_grpc.FunctionRuntimeStub(channel)
            await stub.FenceHost(pb.FenceHostRequest(host_uid=host_uid), timeout=timeout_s)
    except grpc.aio.AioRpcError as e:
        if e.code() is grpc.StatusCode.UNIMPLEMENTED:
            return False
        if e.code() is grpc.StatusCode.FAILED_PRECONDITION:
            raise HostRpcError(FailureReason.InvalidResponse, f"{address} is not host {host_uid}") from e
        raise HostRpcError(
            FailureReason.ProviderUnavailable, f"{address}: {e.code().name}: {e.details()}"
        ) from e
    return True


async def unregister_all(address: str, *, host_uid: str, timeout_s: float) -> int:
    """Unregister every registration the host at ``address`` holds (no grace: they are fenced);
    returns how many. HostRpcError when it cannot be reached or is another incarnation."""
    check_address(address)
    try:
        async with host_channel(address) as channel:
            stub = pb_grpc.FunctionRuntimeStub(channel)
            info = await stub.HostInfo(pb.HostInfoRequest(), timeout=timeout_s)
            if info.host_uid != host_uid:
                raise HostRpcError(FailureReason.InvalidResponse, f"{address} is host {info.host_uid} now")
            for reg in info.registrations:
                await stub.UnregisterFunction(
                    pb.UnregisterFunctionRequest(registration_id=reg.registration_id, grace_ms=1),
                    timeout=timeout_s,
                )
    except grpc.aio.AioRpcError as e:
        raise HostRpcError(
            FailureReason.ProviderUnavailable, f"{address}: {e.code().name}: {e.details()}"
        ) from e
    return len(info.registrations)
