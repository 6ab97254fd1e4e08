"""Gateway metrics: labels are the route and the status only — never ids, users or tokens."""

from __future__ import annotations

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
