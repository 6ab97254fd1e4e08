"""Fixtures of the kubernetes provider's tests: a test cluster (kmock's emulator, scripted where
it does not emulate) with a test kubelet running real `krt host` processes, and the real
kubernetes-asyncio client pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kmock import Server
from kubernetes_asyncio import client as k8s

from kruntimes.activities.hosts.kubernetes import KubernetesAccess, KubernetesProvider, connect
from kruntimes.config.runtimes import KubernetesPodTemplate, KubernetesRuntime
from kruntimes.contracts.providers import HostSpec
from kruntimes.pki import HostIssuer
from tests.kubernetes.cluster import Cluster, TestKubelet, test_cluster
from tests.support.pki import TestPKI

NAMESPACE = "krt-hosts"
IMAGE = "registry.example/kruntimes:test"


@dataclass
class Env:
    cluster: Cluster
    server: Server
    kubelet: TestKubelet
    api: k8s.ApiClient
    root: Path
    pki: TestPKI

    @property
    def url(self) -> str:
        return str(self.server.url).rstrip("/")

    def provider(
        self, *, control_plane: str = "cp-a", issuer: HostIssuer | None = None, **settings: Any
    ) -> KubernetesProvider:
        """`issuer`: the host certificates' (default: the session CA's)."""
        runtimes = settings.pop("runtimes", None) or {"python": runtime(**settings)}
        return KubernetesProvider(
            self.api,
            runtimes=runtimes,
            control_plane=control_plane,
            issuer=issuer or self.pki.issuer(),
            rpc_timeout_s=2.0,
        )

    def pods(self) -> list[dict[str, Any]]:
        return self.cluster.pods(NAMESPACE)


def runtime(**overrides: Any) -> KubernetesRuntime:
    template = overrides.pop("podTemplate", None) or KubernetesPodTemplate(image=IMAGE)
    values: dict[str, Any] = {
        "namespace": NAMESPACE,
        "podTemplate": template,
        "startTimeoutSeconds": 20.0,
        "deleteGraceSeconds": 5,
    }
    return KubernetesRuntime(**{**values, **overrides})


def spec(host_id: str = "python-0", *, runtime: str = "python", **fields: Any) -> HostSpec:
    return HostSpec(
        runtime=runtime,
        hostId=host_id,
        adapter="python",
        provider="kubernetes",
        stateDir="/nonexistent",
        heartbeatIntervalSeconds=0.5,
        **fields,
    )


@pytest.fixture
async def env(tmp_path: Path, pki: TestPKI) -> AsyncIterator[Env]:
    async with test_cluster(tmp_path / "node") as (cluster, server, kubelet):
        api = await connect(KubernetesAccess(host=str(server.url)))
        try:
            yield Env(cluster, server, kubelet, api, tmp_path, pki)
        finally:
            await api.close()
