"""The host pods the kubernetes provider builds, through the real provider, from what a rendered
chart gives it: the worker's args and the runtimes ConfigMap."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from kruntimes.activities.hosts import kubernetes as kube
from kruntimes.activities.hosts import kubernetes_pods as pods
from kruntimes.config.runtimes import KUBERNETES_PROVIDER, parse_config
from kruntimes.contracts.providers import HostSpec
from kruntimes.workers import worker as worker_main
from tests.helm.conftest import Rendered, render, rendered, runtimes_file, worker_args


def built_pods(chart: Rendered) -> list[dict[str, Any]]:
    args = worker_main.parse_args(worker_args(chart))
    config = parse_config(yaml.safe_load(runtimes_file(chart)))
    runtimes = kube.runtimes_of(config)
    assert set(runtimes) == {r.name for r in config.runtimes}, "every runtime's hosts are pods"
    kube.validate_templates(runtimes, control_plane=args.control_plane_id)
    kube.check_certificates(runtimes, can_issue=args.platform_ca is not None)
    built = []
    for runtime in config.runtimes:
        assert runtime.provider == KUBERNETES_PROVIDER and runtime.kubernetes is not None
        tenant = config.tenants[0].name if config.tenants else None
        spec = HostSpec(
            runtime=runtime.name,
            hostId=f"{runtime.name}-0",
            adapter=runtime.adapter,
            provider=KUBERNETES_PROVIDER,
            tenant=tenant,
            stateDir=str(args.state_dir),
            gateways=args.gateway_heartbeat,
            heartbeatIntervalSeconds=args.heartbeat_interval,
        )
        built.append(pods.build_pod(spec, runtime.kubernetes, control_plane=args.control_plane_id))
    return built


def chart_runtime(
    name: str,
    *,
    namespace: str,
    image: str,
    kubernetes: dict[str, Any],
    values: dict[str, Any] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """The default chart's first runtime as its runtimes ConfigMap holds it (its pod template as
    the chart renders it: security contexts, volumes, resources), renamed and moved to a test
    cluster's namespace and image; `kubernetes` and `fields` set more of it. `values`: the chart
    rendered with these instead of its defaults."""
    chart = rendered("default") if values is None else Rendered("values", values, *render(values))
    config = yaml.safe_load(runtimes_file(chart))
    runtime: dict[str, Any] = copy.deepcopy(config["runtimes"][0])
    runtime["kubernetes"]["podTemplate"]["image"] = image
    runtime["kubernetes"].update(namespace=namespace, **kubernetes)
    runtime.update(name=name, **fields)
    return runtime
