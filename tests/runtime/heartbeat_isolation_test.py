"""A host's heartbeats say which isolation is in force (what krt status shows too): read by a
heartbeat receiver with a gateway's certificate, from a real host."""

from __future__ import annotations

import os
import queue
from concurrent import futures
from pathlib import Path

import grpc

from kruntimes.rpc.v1 import heartbeat_pb2 as hb
from kruntimes.rpc.v1 import heartbeat_pb2_grpc as hb_grpc
from kruntimes.runtime.service import isolation_message
from tests.support.pki import TestPKI
from tests.support.runtime_hosts import loopback_host

BOUND_S = 60.0


class Receiver(hb_grpc.RouteHeartbeatServicer):
    def __init__(self) -> None:
        self.beats: queue.Queue[hb.HostHeartbeat] = queue.Queue()

    def Heartbeats(self, request_iterator, context):  # type: ignore[no-untyped-def]
        for beat in request_iterator:
            self.beats.put(beat)
        return hb.HeartbeatAck()


def test_a_hosts_heartbeat_says_which_isolation_is_in_force(pki: TestPKI, tmp_path: Path) -> None:
    receiver = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    hb_grpc.add_RouteHeartbeatServicer_to_server(receiver, server)
    port = server.add_secure_port("127.0.0.1:0", pki.gateway.server_credentials())
    server.start()
    runtime = loopback_host(
        pki, tmp_path / "host", host_id="beat-0", gateways=(f"127.0.0.1:{port}",), heartbeat_interval_s=0.5
    )
    try:
        runtime.start()
        beat = receiver.beats.get(timeout=BOUND_S)
        assert runtime.in_force is not None
        assert beat.isolation == isolation_message(runtime.in_force)
        # a root host gives each function its own uid; any other host runs only when told same-user
        assert beat.isolation.isolation == ("uid" if os.geteuid() == 0 else "same-user")
        assert beat.isolation.summary == runtime.in_force.describe()
    finally:
        runtime.stop(grace_s=1)
        server.stop(1).wait()
