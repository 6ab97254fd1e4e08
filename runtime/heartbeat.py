"""Host → gateway heartbeats: this host's registrations, sent at once on any change and otherwise
every interval, on one long-lived client stream per gateway. A stream's first message is whole,
later ones carry what changed since the previous one (and, every WHOLE_EVERY_S, one is whole
again): see proto/kruntimes/rpc/v1/heartbeat.proto.

Each gateway gets its own thread that reconnects with backoff; a host with no reachable gateway
keeps serving (invokes simply cannot reach it until a gateway hears from it). Streams are mutual
TLS with the host's platform certificate; the gateway must present a gateway certificate of the
platform CA. Each reconnection uses the certificate files as they are then. The gateways may be
replaced while the host runs (`set_gateways`, from the supervision stream): a gateway dropped from
the list gets a last `leaving` heartbeat, a new one its own thread. A gateway given as
`dns+all://NAME:PORT` stands for every address NAME resolves to (kruntimes.runtime.discovery), resolved
again every `discovery.interval_s`: an address that appears gets a stream, one that goes a last
`leaving` heartbeat.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from kruntimes.pki import PeerTLS, Role
from kruntimes.rpc.v1 import heartbeat_pb2 as hb
from kruntimes.rpc.v1 import heartbeat_pb2_grpc as hb_grpc
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.runtime.discovery import GatewayDiscovery

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 5.0


# A stream's message is whole again this often (the rest are deltas): it mends what a gateway
# dropped on its own, such as a route the host refused, at a cost of one snapshot per interval.
WHOLE_EVERY_S = 30.0


@dataclass
class _Sent:
    """What one stream has said: the registrations by run uid (the host's own messages, reused
    while unchanged) and when its last whole message went."""

    states: dict[str, pb.RegistrationState] = field(default_factory=dict)
    whole_at: float = 0.0


class HeartbeatSender:
    def __init__(
        self,
        *,
        gateways: list[str],
        host_id: str,
        host_uid: str,
        runtime: str,
        address: str,
        interval_s: float,
        tls: PeerTLS,
        invoke_address: str = "",
        snapshot: Callable[[], list[pb.RegistrationState]],
        isolation: pb.HostIsolation | None = None,
        discovery: GatewayDiscovery | None = None,
    ) -> None:
        self.gateways = gateways  # as given (addresses and names to resolve)
        self.discovery = discovery or GatewayDiscovery()
        self._addresses: list[str] = []  # what they stand for now: one stream each
        self.tls = tls
        self.identity = {
            "host_id": host_id,
            "host_uid": host_uid,
            "runtime": runtime,
            "address": address,
            "invoke_address": invoke_address,
        }
        self.isolation = isolation
        self.interval_s = interval_s
        self.whole_every_s = WHOLE_EVERY_S
        self.snapshot = snapshot
        self._changed = threading.Condition()
        self._generation = 0
        self._stopping = False
        self._started = False
        self._threads: list[threading.Thread] = []
        self._active: set[str] = set()  # the gateways heartbeats go to now
        self._by_gateway: dict[str, threading.Thread] = {}
        self._taken: dict[str, float] = {}  # gateway → when its stream last took a message
        self._stopped = threading.Event()
        self._resolver: threading.Thread | None = None

    def start(self) -> None:
        addresses = self.discovery.expand(self.gateways)
        with self._changed:
            self._started = True
            self._apply(addresses)
            self._start_resolver()

    def _apply(self, addresses: list[str]) -> None:
        """Stream to exactly these addresses (the lock held): new ones get a thread, dropped ones a
        last `leaving` heartbeat."""
        self._addresses = addresses
        if self._started:
            for gateway in self._active - set(addresses):
                self._active.discard(gateway)
                self._taken.pop(gateway, None)
            for gateway in addresses:
                if gateway not in self._active:
                    self._start_thread(gateway)
        self._generation += 1
        self._changed.notify_all()

    def _start_resolver(self) -> None:
        """The thread that resolves the gateway names again every interval (the lock held)."""
        if self._resolver is not None or not self.discovery.dynamic(self.gateways):
            return
        self._resolver = threading.Thread(target=self._rediscover, name="heartbeat-discovery", daemon=True)
        self._resolver.start()
        self._threads.append(self._resolver)

    def _rediscover(self) -> None:
        while not self._stopped.wait(self.discovery.interval_s):
            with self._changed:
                targets = list(self.gateways)
            addresses = self.discovery.expand(targets)  # outside the lock: a lookup may take a while
            with self._changed:
                if self._stopping or self.gateways != targets or addresses == self._addresses:
                    continue
                log.info("heartbeat gateways resolved to other addresses", extra={"gateways": addresses})
                self._apply(addresses)

    def _start_thread(self, gateway: str) -> None:
        self._active.add(gateway)
        running = self._by_gateway.get(gateway)
        if running is not None and running.is_alive():
            return  # dropped and added again before its thread ended: that thread carries on
        thread = threading.Thread(target=self._run, args=(gateway,), name=f"heartbeat-{gateway}", daemon=True)
        thread.start()
        self._by_gateway[gateway] = thread
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]

    def set_gateways(self, gateways: list[str]) -> None:
        """Send heartbeats to these gateways from now on (the others get a last `leaving` one)."""
        wanted = list(dict.fromkeys(gateways))
        addresses = self.discovery.expand(wanted)
        with self._changed:
            if self._stopping:
                return
            self.gateways = wanted
            self._apply(addresses)
            if self._started:
                self._start_resolver()

    def links(self) -> list[tuple[str, bool]]:
        """Each gateway and whether its stream took a message within the last two intervals."""
        now = time.monotonic()
        with self._changed:
            return [(g, now - self._taken.get(g, -1e18) <= 2 * self.interval_s) for g in self._addresses]

    def changed(self) -> None:
        """Registrations changed: every stream sends a snapshot now."""
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Send a last `leaving` heartbeat on each stream, then end them."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self._stopped.set()
        for thread in self._threads:
            thread.join(timeout_s)

    def _message(
        self, sequence: int, *, leaving: bool = False, sent: _Sent | None = None
    ) -> hb.HostHeartbeat:
        """The message numbered `sequence` of a stream. With `sent` (what the stream said so
        far, updated here): whole if it is the stream's first or the last whole one is
        `whole_every_s` old, else a delta against it."""
        sent_at = Timestamp()
        sent_at.FromDatetime(datetime.now(UTC))
        registrations: list[pb.RegistrationState] = [] if leaving else self.snapshot()
        removed: list[str] = []
        delta = False
        if sent is not None and not leaving:
            now = time.monotonic()
            current = {r.run_uid: r for r in registrations}
            delta = sequence > 1 and now - sent.whole_at < self.whole_every_s
            if delta:
                removed = sorted(sent.states.keys() - current.keys())
                # the host keeps one message per unchanged registration: identity says unchanged
                registrations = [r for r in registrations if sent.states.get(r.run_uid) is not r]
            else:
                sent.whole_at = now
            sent.states = current
        return hb.HostHeartbeat(
            host_id=self.identity["host_id"],
            host_uid=self.identity["host_uid"],
            runtime=self.identity["runtime"],
            address=self.identity["address"],
            invoke_address=self.identity["invoke_address"],
            isolation=self.isolation,
            sequence=sequence,
            interval_ms=int(self.interval_s * 1000),
            sent_at=sent_at,
            registrations=registrations,
            leaving=leaving,
            delta=delta,
            removed=removed,
        )

    def _messages(self, gateway: str = "") -> Iterator[hb.HostHeartbeat]:
        sequence = 0
        seen = -1
        sent = _Sent()
        while True:
            with self._changed:
                if not self._stopping and seen == self._generation:
                    self._changed.wait(self.interval_s)
                stopping, seen = self._stopping, self._generation
                dropped = bool(gateway) and gateway not in self._active
            sequence += 1
            if stopping or dropped:
                yield self._message(sequence, leaving=True)
                return
            with self._changed:
                self._taken[gateway] = time.monotonic()
            yield self._message(sequence, sent=sent)

    def _run(self, gateway: str) -> None:
        backoff = 0.1
        while not self._stopping and gateway in self._active:
            try:
                channel = grpc.secure_channel(
                    gateway, self.tls.channel_credentials(), options=self.tls.channel_options(Role.GATEWAY)
                )
                with channel:
                    hb_grpc.RouteHeartbeatStub(channel).Heartbeats(self._messages(gateway))
                backoff = 0.1
            except grpc.RpcError as err:
                log.warning("heartbeat stream to %s failed: %s", gateway, err.code().name)
            with self._changed:
                self._taken.pop(gateway, None)
                if self._stopping or gateway not in self._active:
                    return
                self._changed.wait(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
