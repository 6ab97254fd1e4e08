"""The gateway's heartbeat endpoint (gRPC RouteHeartbeat), feeding the route cache, and on the
same server the load its Functions have here (GatewayLoad.FunctionLoads, for the autoscaler) and
the attempts of async invocations (GatewayDispatch.AttemptInvocation, gateway/dispatch.py).

Mutual TLS with the gateway's platform certificate: only hosts of the platform CA may send beats
(kruntimes.pki.PeerAuthorization), and each beat only about the host its certificate names
(gateway/routes.py checks that, and the assignment of every registration). A beat that is not
the sender's to make ends its stream with PERMISSION_DENIED. Only the control plane's identity
may run attempts and read the loads: at most MAX_LOAD_UIDS Functions a call, each answered from the balancer's
counters (no route walk), so a call costs what it asks.

It runs on the gateway's event loop (grpc.aio), so applying a heartbeat needs no locks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kruntimes.api.names import is_run_uid
from kruntimes.gateway.dispatch import DispatchService
from kruntimes.gateway.function_invoke import Balancer
from kruntimes.gateway.invoke import Upstreams
from kruntimes.gateway.routes import DeltaWithoutBase, HeartbeatRefused, RouteCache
from kruntimes.pki import ANY_ROLE, PeerAuthorization, PeerTLS, Role, peer_identity
from kruntimes.rpc.v1 import gateway_dispatch_pb2_grpc as gd_grpc
from kruntimes.rpc.v1 import heartbeat_pb2 as hb
from kruntimes.rpc.v1 import heartbeat_pb2_grpc as hb_grpc
from kruntimes.temporal.known_runs import KnownRuns

log = logging.getLogger(__name__)

MAX_HEARTBEAT_BYTES = 64 * 1024 * 1024  # a snapshot of a very full host
SWEEP_INTERVAL_S = 1.0
MAX_LOAD_UIDS = 1000  # Functions one FunctionLoads call may ask about
# only hosts send heartbeats; only the control plane reads loads and runs async attempts; any
# platform identity may ask for health; nothing else is served
ALLOWED_ROLES = {
    "/kruntimes.rpc.v1.RouteHeartbeat/Heartbeats": frozenset({Role.HOST}),
    "/kruntimes.rpc.v1.GatewayLoad/FunctionLoads": frozenset({Role.CONTROL_PLANE}),
    "/kruntimes.rpc.v1.GatewayDispatch/AttemptInvocation": frozenset({Role.CONTROL_PLANE}),
    "/grpc.health.v1.Health/Check": ANY_ROLE,
    "/grpc.health.v1.Health/Watch": ANY_ROLE,
}


class HeartbeatService(hb_grpc.RouteHeartbeatServicer):
    def __init__(self, routes: RouteCache) -> None:
        self.routes = routes
        self.received = 0

    async def Heartbeats(
        self,
        request_iterator: AsyncIterator[hb.HostHeartbeat],
        context: grpc.aio.ServicerContext[hb.HostHeartbeat, hb.HeartbeatAck],
    ) -> hb.HeartbeatAck:
        peer = peer_identity(context)
        if peer is None:  # the interceptor let only hosts in; kept for the type
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "no platform identity")
            raise AssertionError("unreachable: abort raises")
        last = 0
        stream = object()  # what this stream's beats built in the route cache is marked with it
        skipped_before = 0
        async for beat in request_iterator:
            try:
                continues = last > 0 and beat.sequence == last + 1
                skipped = await self.routes.apply(beat, peer=peer, stream=stream, continues=continues)
            except HeartbeatRefused as e:
                log.warning("heartbeat refused", extra={"peer": str(peer), "error": str(e)})
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))
                raise AssertionError("unreachable: abort raises") from None
            except DeltaWithoutBase as e:  # the host starts its stream again, whole
                log.info("heartbeat delta without its base", extra={"peer": str(peer), "error": str(e)})
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
                raise AssertionError("unreachable: abort raises") from None
            if skipped != skipped_before:  # logged when it changes, not for every beat
                log.warning(
                    "registrations without a valid assignment were not routed",
                    extra={"peer": str(peer), "skipped": skipped},
                )
                skipped_before = skipped
            self.received += 1
            last = beat.sequence
        return hb.HeartbeatAck(last_sequence=last)


class LoadService(hb_grpc.GatewayLoadServicer):
    """What the balancer counts of each Function asked about: in flight on its replicas, held."""

    def __init__(self, balancer: Balancer) -> None:
        self.balancer = balancer

    async def FunctionLoads(
        self,
        request: hb.FunctionLoadsRequest,
        context: grpc.aio.ServicerContext[hb.FunctionLoadsRequest, hb.FunctionLoadsResponse],
    ) -> hb.FunctionLoadsResponse:
        uids = request.function_uids
        if len(uids) > MAX_LOAD_UIDS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"at most {MAX_LOAD_UIDS} Functions a call")
            raise AssertionError("unreachable: abort raises")
        if not all(is_run_uid(uid) for uid in uids):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a function uid is not a canonical uuid")
            raise AssertionError("unreachable: abort raises")
        balancer = self.balancer
        return hb.FunctionLoadsResponse(
            loads=[
                hb.FunctionLoad(
                    function_uid=uid,
                    in_flight=balancer.function_in_flight(uid),
                    waiting=balancer.waiting(uid),
                )
                for uid in uids
            ]
        )


class HeartbeatServer:
    def __init__(
        self,
        routes: RouteCache,
        listen: str,
        *,
        tls: PeerTLS,
        balancer: Balancer | None = None,
        known: KnownRuns | None = None,
        upstreams: Upstreams | None = None,
    ) -> None:
        """`known`, `upstreams`: the gateway's, which async attempts share with its sync invokes
        (None: a view that knows no Run, and upstreams of the server's own)."""
        self.routes = routes
        self.listen = listen
        self.tls = tls
        self.service = HeartbeatService(routes)
        balancer = balancer or Balancer(routes)
        self.loads = LoadService(balancer)
        self._own_upstreams = upstreams is None
        self.upstreams = upstreams or Upstreams(tls=tls)
        self.dispatch = DispatchService(
            routes=routes, known=known or KnownRuns(None), upstreams=self.upstreams, balancer=balancer
        )
        self.server: grpc.aio.Server | None = None
        self.address = ""
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> str:
        server = grpc.aio.server(
            interceptors=[PeerAuthorization(ALLOWED_ROLES, default=frozenset())],
            options=[
                ("grpc.max_receive_message_length", MAX_HEARTBEAT_BYTES),
                # No bandwidth-delay probing: it grows each host's receive window (and the buffers
                # behind it) for throughput that a few beats a second never need.
                ("grpc.http2.bdp_probe", 0),
            ],
        )
        hb_grpc.add_RouteHeartbeatServicer_to_server(self.service, server)
        hb_grpc.add_GatewayLoadServicer_to_server(self.loads, server)
        gd_grpc.add_GatewayDispatchServicer_to_server(self.dispatch, server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        port = server.add_secure_port(self.listen, self.tls.server_credentials())
        if port == 0:
            raise OSError(f"cannot listen on {self.listen}")
        await server.start()
        await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        self.server = server
        self.address = f"{self.listen.rsplit(':', 1)[0]}:{port}"
        self._sweeper = asyncio.create_task(self._sweep())
        return self.address

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            forgotten = self.routes.sweep()
            if forgotten:
                log.warning("forgot %d silent host(s)", forgotten)

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.server is not None:
            await self.server.stop(1.0)
        if self._own_upstreams:
            await self.upstreams.close()
