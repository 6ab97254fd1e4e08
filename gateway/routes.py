"""The route cache: run uid → the host that serves it, fed only by host heartbeats.

Each heartbeat is a full snapshot of one host incarnation (host uid), so applying it replaces
everything that host said before. A host silent for `missed` intervals is forgotten, and a host
that announces `leaving` at once. A new incarnation (same host id or address, new uid) replaces
the old one. The invoke path only reads this structure: no Temporal, no Kubernetes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kruntimes.rpc.v1 import heartbeat_pb2 as hb
from kruntimes.rpc.v1 import runtime_pb2 as pb

MISSED_INTERVALS = 3
MAX_HOSTS = 10_000
MAX_REGISTRATIONS_PER_HOST = 100_000


@dataclass(frozen=True, slots=True)
class Route:
    run_uid: str
    namespace: str
    name: str
    runtime: str
    registration_id: str
    attempt: int
    ready: bool
    host_id: str
    host_uid: str
    address: str
    invoke_address: str = ""  # the host's raw invoke port; empty: InvokeFunction over gRPC


@dataclass(slots=True)
class _Host:
    host_id: str
    address: str
    expires: float
    routes: dict[str, Route]


class RouteCache:
    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, missed: int = MISSED_INTERVALS
    ) -> None:
        self._clock = clock
        self._missed = missed
        self._hosts: dict[str, _Host] = {}  # host uid → host
        self._routes: dict[str, dict[str, Route]] = {}  # run uid → host uid → route

    def apply(self, beat: hb.HostHeartbeat) -> None:
        if beat.leaving:
            self.forget(beat.host_uid)
            return
        for uid, host in list(self._hosts.items()):
            if uid != beat.host_uid and (host.host_id == beat.host_id or host.address == beat.address):
                self.forget(uid)  # a new incarnation of the same host
        if beat.host_uid not in self._hosts and len(self._hosts) >= MAX_HOSTS:
            return
        interval_s = max(beat.interval_ms, 100) / 1000.0
        routes = {
            r.run_uid: Route(
                run_uid=r.run_uid,
                namespace=r.namespace,
                name=r.name,
                runtime=r.runtime,
                registration_id=r.registration_id,
                attempt=r.attempt,
                ready=r.phase == pb.REGISTRATION_PHASE_READY,
                host_id=beat.host_id,
                host_uid=beat.host_uid,
                address=beat.address,
                invoke_address=beat.invoke_address,
            )
            for r in beat.registrations[:MAX_REGISTRATIONS_PER_HOST]
        }
        old = self._hosts.get(beat.host_uid)
        if old is not None:
            for run_uid in old.routes.keys() - routes.keys():
                self._unlink(run_uid, beat.host_uid)
        self._hosts[beat.host_uid] = _Host(
            beat.host_id, beat.address, self._clock() + self._missed * interval_s, routes
        )
        for run_uid, route in routes.items():
            self._routes.setdefault(run_uid, {})[beat.host_uid] = route

    def forget(self, host_uid: str) -> None:
        host = self._hosts.pop(host_uid, None)
        if host is not None:
            for run_uid in host.routes:
                self._unlink(run_uid, host_uid)

    def _unlink(self, run_uid: str, host_uid: str) -> None:
        held = self._routes.get(run_uid)
        if held is not None:
            held.pop(host_uid, None)
            if not held:
                del self._routes[run_uid]

    def route(self, run_uid: str) -> Route | None:
        """The newest attempt among live hosts that hold the run (ready ones first)."""
        held = self._routes.get(run_uid)
        if not held:
            return None
        now = self._clock()
        best: Route | None = None
        for host_uid in list(held):
            host = self._hosts.get(host_uid)
            if host is None or host.expires <= now:
                self.forget(host_uid)
                continue
            route = held.get(host_uid)
            if route is not None and (
                best is None or (route.ready, route.attempt) > (best.ready, best.attempt)
            ):
                best = route
        return best

    def drop(self, run_uid: str, host_uid: str) -> None:
        """The host refused this route (fence): forget it until its next heartbeat says otherwise."""
        host = self._hosts.get(host_uid)
        if host is not None:
            host.routes.pop(run_uid, None)
        self._unlink(run_uid, host_uid)

    def sweep(self) -> int:
        now = self._clock()
        expired = [uid for uid, host in self._hosts.items() if host.expires <= now]
        for uid in expired:
            self.forget(uid)
        return len(expired)

    def hosts(self) -> int:
        return len(self._hosts)

    def __len__(self) -> int:
        return len(self._routes)
