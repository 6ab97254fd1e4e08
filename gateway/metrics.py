"""Gateway metrics: labels are the route, the status, the reason and the connection limit or cut
reason only — never ids, users, addresses or tokens."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.duration = Histogram(
            "krt_gateway_request_duration_seconds",
            "Time to answer a gateway request",
            ["route", "status"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.requests = Counter(
            "krt_gateway_requests_total",
            "Gateway requests by route, status and reason",
            ["route", "status", "reason"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "krt_gateway_in_flight_requests", "Requests being answered", registry=self.registry
        )
        self.routes = Gauge("krt_gateway_routes", "Runs the route cache can reach", registry=self.registry)
        self.hosts = Gauge("krt_gateway_hosts", "Hosts heard from recently", registry=self.registry)
        self.connections = Gauge(
            "krt_gateway_connections",
            "Client connections open (the TLS handshake included)",
            registry=self.registry,
        )
        self.connections_refused = Counter(
            "krt_gateway_connections_refused_total",
            "Connections closed at accept: over the total or the per-client cap",
            ["limit"],
            registry=self.registry,
        )
        self.connections_cut = Counter(
            "krt_gateway_connections_cut_total",
            "Connections closed by a timeout: header_timeout, tls_handshake (failed or too slow)",
            ["reason"],
            registry=self.registry,
        )
        # A Function's URL (gateway/function_invoke.py): totals over every Function, no per-Function
        # label (a label per uid would grow without bound)
        self.function_in_flight = Gauge(
            "krt_gateway_function_in_flight",
            "Invocations of Functions this gateway has dispatched to a replica and not yet answered",
            registry=self.registry,
        )
        self.function_waiting = Gauge(
            "krt_gateway_function_waiting",
            "Invocations of Functions waiting at this gateway for a replica with room",
            registry=self.registry,
        )
        self.function_waits = Counter(
            "krt_gateway_function_waits_total",
            "Waits at the gateway for a Function's replica, by how they ended: dispatched, full "
            "(refused at once: the wait's bound), timeout, withdrawn (the caller hung up); held "
            "without a Ready replica: cold_timeout (none became Ready in time), not_woken (its "
            "workflow could not be asked)",
            ["outcome"],
            registry=self.registry,
        )
        self.function_wakes = Counter(
            "krt_gateway_function_wakes_total",
            "Signals asking a Function's workflow for a replica (scale from zero), by result: sent, "
            "failed (Temporal unreachable or refusing, the workflow not running)",
            ["result"],
            registry=self.registry,
        )
        # Async invocations' attempts (gateway/dispatch.py): by target kind and answer, no per-target label
        self.async_attempts = Counter(
            "krt_gateway_async_attempts_total",
            "Attempts of async invocations this gateway ran for the control plane, by target kind "
            "(Run, Function) and the status and reason a sync invoke would have been answered "
            "(429 AsyncShareFull: the target's async share was held; 499 ClientClosedRequest: the worker's "
            "call ended first)",
            ["kind", "status", "reason"],
            registry=self.registry,
        )
        self.async_in_flight = Gauge(
            "krt_gateway_async_attempts_in_flight",
            "Attempts of async invocations this gateway runs now (waiting for a replica included)",
            registry=self.registry,
        )
        self.functions = Gauge(
            "krt_gateway_functions", "Functions with at least one replica route", registry=self.registry
        )
        self._children: dict[tuple[str, str, str], tuple[Any, Any]] = {}

    def observe(self, route: str, status: str, reason: str, seconds: float) -> None:
        """Record one answer; labelled children are looked up once per label set."""
        key = (route, status, reason)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self.duration.labels(route, status),
                self.requests.labels(route, status, reason),
            )
        children[0].observe(seconds)
        children[1].inc()

    def connection_refused(self, limit: str) -> None:
        self.connections_refused.labels(limit).inc()

    def connection_cut(self, reason: str) -> None:
        self.connections_cut.labels(reason).inc()
