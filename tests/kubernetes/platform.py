"""The whole platform with `provider: kubernetes` runtimes: the real Temporal dev server (in
memory), the worker (in this process, or as `krt worker` processes for the restart test), an HTTPS
gateway, and the test cluster whose kubelet runs the host pods as real `krt host` processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kmock import Server

from kruntimes.activities.hosts.kubernetes import KubernetesAccess
from tests.kubernetes.cluster import Cluster, TestKubelet, test_cluster
from tests.support.pki import TestPKI
from tests.support.stack import Stack, inline_manifest, running_stack

TOKEN = "krt-k8s-test-token"
NAMESPACE = "krt-e2e"
IMAGE = "registry.example/kruntimes:e2e"
# `boot` is new in every process that loads the function: a function runs as PID 1 of a PID
# namespace of its own, so its pid says nothing about which host it runs on.
ECHO = (
    "import os, uuid\nBOOT = uuid.uuid4().hex\n"
    "def handle(p):\n    return {'echo': p, 'pid': os.getpid(), 'boot': BOOT, 'uid': os.getuid()}\n"
)
ROOT = Path(__file__).resolve().parents[2]


def kubernetes_runtime(name: str, *, pool: dict[str, Any] | None = None, **kubernetes: Any) -> dict[str, Any]:
    block = {
        "namespace": NAMESPACE,
        "startTimeoutSeconds": 20,
        "deleteGraceSeconds": 5,
        "podTemplate": {"image": IMAGE},
        **kubernetes,
    }
    return {
        "name": name,
        "adapter": "python",
        "runs": 4,
        "maxHosts": 2,
        "provider": "kubernetes",
        "kubernetes": block,
        **(pool or {}),
    }


def manifest(name: str, runtime: str, *, source: str = ECHO) -> dict[str, Any]:
    return inline_manifest(name, runtime=runtime, source=source)


@dataclass
class KubePlatform(Stack):
    root: Path
    cluster: Cluster
    server: Server
    kubelet: TestKubelet
    pki: TestPKI

    @property
    def tls_ca(self) -> Path:
        return self.tls.ca_cert

    @property
    def api_url(self) -> str:
        return str(self.server.url).rstrip("/")

    def pods(self, runtime: str | None = None) -> list[dict[str, Any]]:
        return [
            p
            for p in self.cluster.pods(NAMESPACE)
            if runtime is None or p["metadata"]["labels"].get("kruntimes.io/runtime") == runtime
        ]

    def kubeconfig(self) -> Path:
        path = self.root / "kubeconfig"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "test", "cluster": {"server": self.api_url}}],
                    "users": [{"name": "worker", "user": {"token": "worker-token"}}],
                    "contexts": [{"name": "test", "context": {"cluster": "test", "user": "worker"}}],
                    "current-context": "test",
                }
            )
        )
        return path

    def worker_process(
        self, *, runtimes: list[dict[str, Any]], queue: str, control_plane: str, log: Path
    ) -> subprocess.Popen[bytes]:
        """`krt worker` for ``runtimes`` on task queues of its own, reaching the cluster through
        a kubeconfig file."""
        config = self.root / f"runtimes-{queue}.yaml"
        config.write_text(yaml.safe_dump({"runtimes": runtimes}))
        argv = [sys.executable, "-m", "kruntimes.workers.krt", "worker"]
        argv += ["--temporal-address", self.dev_server.address, "--config", str(config)]
        argv += ["--state-dir", str(self.state_dir), "--gateway-url", self.config.gatewayUrl]
        argv += ["--ca-file", str(self.tls_ca), "--gateway-heartbeat", self.gateway.heartbeat_address]
        argv += ["--heartbeat-interval", "0.5", "--task-queue", queue, "--pool-task-queue", f"{queue}-pool"]
        argv += ["--kubeconfig", str(self.kubeconfig()), "--kube-context", "test"]
        argv += ["--control-plane-id", control_plane, "--log-level", "info"]
        trust = self.pki.worker_trust()
        argv += ["--peer-tls", str(trust.peer_tls), "--assignment-key", str(trust.assignment_key)]
        argv += ["--platform-ca", str(trust.platform_ca)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("KRT_")}
        with open(log, "ab") as out:
            return subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )


def stop_process(process: subprocess.Popen[bytes], *, sig: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


@contextlib.asynccontextmanager
async def kube_platform(
    root: Path, pki: TestPKI, *, runtimes: list[dict[str, Any]]
) -> AsyncIterator[KubePlatform]:
    async with (
        test_cluster(root / "node") as (cluster, api_server, kubelet),
        running_stack(
            root,
            pki,
            runtimes=runtimes,
            tokens={TOKEN: 'alice,1000,"devs"'},
            # Hosts are found lost through the pod watch; the periodic probe is far away.
            probe_interval_s=600.0,
            kubernetes=KubernetesAccess(host=str(api_server.url)),
            control_plane_id="e2e",
        ) as started,
    ):
        yield KubePlatform(
            **started.parts(), root=root, cluster=cluster, server=api_server, kubelet=kubelet, pki=pki
        )
