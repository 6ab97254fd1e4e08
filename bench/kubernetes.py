"""Benchmark: hosts as pods (the kubernetes provider and its test kubelet) next to the process
provider, in one run.

    .venv/bin/python bench/kubernetes.py [--rounds N]

The cluster is the tests' test cluster (tests/kubernetes/cluster.py): kmock's Kubernetes
emulator with uids, resourceVersions, graceful deletion and per-pod ports scripted, and a test
kubelet that starts a real `krt host` process for each pod, probes its gRPC health (every 20 ms
until Ready) and reports the pod's status through the API, as a kubelet does. The platform is the
one of tests/kubernetes/platform.py: the Temporal dev server (in memory, with its throughput
settings), the worker in this process (its pod watch on), the HTTPS gateway; all on 127.0.0.1.

Measured, alternating process and kubernetes so that background load hits both alike:
  1. host create → serving, at the provider: ProcessProvider.create against
     KubernetesProvider.create (pod created, bound, container started, Ready, Runtime Server
     answering as that pod), each host deleted before the next round; target ≤ 1.5×;
  2. Run create → Ready from zero hosts: one Run on each of N fresh runtimes per provider
     (minHosts 0: each scales out through its provider); target ≤ 1.5×;
  3. recovery: a Ready Run's pod deleted as `kubectl delete pod` does (graceful), timed until
     the Run answers 200 again through the gateway, on another pod; target ≤ 5 s p50.

Prints a table and a final JSON line {"bench": "kubernetes", ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _benchlib  # puts the repository root on sys.path

from kruntimes.activities.hosts._rpc import use_peer_tls
from kruntimes.activities.hosts.events import HostEventQueue
from kruntimes.activities.hosts.kubernetes import KubernetesAccess, KubernetesProvider, connect
from kruntimes.activities.hosts.kubernetes_watch import PodWatch
from kruntimes.activities.hosts.process import ProcessProvider, stop_all
from kruntimes.api import Run
from kruntimes.config.runtimes import KubernetesPodTemplate, KubernetesRuntime
from kruntimes.contracts.providers import HostSpec
from kruntimes.sdk.client import Client
from kruntimes.sdk.errors import NotReady
from tests.kubernetes.platform import IMAGE, NAMESPACE, kube_platform, kubernetes_runtime, manifest
from tests.support.pki import TestPKI

TARGET_RATIO = 1.5
TARGET_RECOVERY_S = 5.0


def p(values: list[float], q: float) -> float:
    return _benchlib.percentile(values, q * 100)


async def provider_rounds(platform, pki: TestPKI, rounds: int, tmp: Path) -> tuple[list[float], list[float]]:
    """Host create → serving at the provider, alternating process and kubernetes."""
    api = await connect(KubernetesAccess(host=platform.api_url))
    settings = KubernetesRuntime(
        namespace=NAMESPACE,
        podTemplate=KubernetesPodTemplate(image=IMAGE),
        startTimeoutSeconds=30,
        deleteGraceSeconds=5,
    )
    kube = KubernetesProvider(api, runtimes={"bench": settings}, control_plane="bench", issuer=pki.issuer())
    watch = PodWatch(
        api, namespace=NAMESPACE, control_plane="bench", on_event=HostEventQueue(), on_pod=kube.notify
    )
    watching = asyncio.create_task(watch.run())
    process = ProcessProvider(state_dir=tmp / "process", issuer=pki.issuer())
    process_times, kube_times = [], []
    try:
        for i in range(rounds + 1):  # round 0 warms up both
            for provider, times in ((process, process_times), (kube, kube_times)):
                spec = HostSpec(
                    runtime="bench",
                    hostId=f"bench-{i}",
                    adapter="python",
                    provider=provider.name,
                    stateDir=str(tmp / "process"),
                )
                started = time.perf_counter()
                host = await provider.create(spec)
                elapsed = time.perf_counter() - started
                if i:
                    times.append(elapsed)
                await provider.delete(runtime="bench", host_id=spec.hostId, host_uid=host.hostUid)
            await _until(
                lambda: not [p for p in platform.pods() if p["metadata"]["name"].startswith("bench-")]
            )
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await api.close()
        await stop_all(tmp / "process")
    return process_times, kube_times


async def from_zero_rounds(krt: Client, rounds: int) -> tuple[list[float], list[float]]:
    process_times, kube_times = [], []
    for i in range(rounds):
        for runtime, times in ((f"pz-{i}", process_times), (f"kz-{i}", kube_times)):
            name = f"zero-{runtime}"
            started = time.perf_counter()
            await krt.create(Run.from_dict(manifest(name, runtime)))
            await krt.wait(name, timeout=60)
            times.append(time.perf_counter() - started)
            await krt.delete(name)
    return process_times, kube_times


async def recovery_rounds(platform, krt: Client, rounds: int) -> list[float]:
    """A new Run each round, its pod deleted once it answered (each Run recovers once: a Run's
    second recovery waits on the pool, which drops its new reservation when the cleanup of its
    first attempt releases the Run's slot by uid)."""
    times = []
    session = platform.kubelet._session
    for i in range(rounds):
        name = f"recovering-{i}"
        await krt.create(Run.from_dict(manifest(name, "krec")))
        await krt.wait(name, timeout=60)
        # which process answered: pids repeat (a function is PID 1 of its own PID namespace)
        boot = (await _answered(krt, name)).outputs["boot"]
        [pod] = platform.pods("krec")
        url = f"{platform.api_url}/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}"
        started = time.perf_counter()
        async with session.delete(url) as answer:
            assert answer.status == 200
        while True:
            try:
                again = await krt.invoke(name, {})
            except Exception:
                again = None
            if again is not None and again.ok and again.outputs["boot"] != boot:
                break
            if time.perf_counter() - started > 60:
                raise RuntimeError("the Run did not answer again within 60 s")
            await asyncio.sleep(0.02)
        times.append(time.perf_counter() - started)
        await krt.delete(name)
        await _until(lambda: len(platform.pods("krec")) == 1)
    return times


async def _answered(krt: Client, name: str):
    """The first answer once the gateway knows the Run is Ready (it learns it a moment later)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return await krt.invoke(name, {})
        except NotReady:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.02)


async def _until(check, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        await asyncio.sleep(0.02)


async def main(rounds: int) -> int:
    runtimes = [kubernetes_runtime("krec")]
    for i in range(rounds):
        runtimes.append(
            {"name": f"pz-{i}", "adapter": "python", "runs": 4, "maxHosts": 1, "provider": "process"}
        )
        runtimes.append(kubernetes_runtime(f"kz-{i}", startTimeoutSeconds=30))
    with tempfile.TemporaryDirectory(prefix="krt-bench-k8s-") as root:
        tmp = Path(root)
        pki = TestPKI.create(tmp / "pki")  # the platform's mutual TLS, as always
        use_peer_tls(pki.control_plane)
        async with kube_platform(tmp / "platform", pki, runtimes=runtimes) as platform:
            try:
                process_host, kube_host = await provider_rounds(platform, pki, rounds, tmp)
                async with Client(platform.config) as krt:
                    process_zero, kube_zero = await from_zero_rounds(krt, rounds)
                    recovery = await recovery_rounds(platform, krt, rounds)
            finally:
                await stop_all(platform.state_dir)
    host_ratio = statistics.median(kube_host) / statistics.median(process_host)
    zero_ratio = statistics.median(kube_zero) / statistics.median(process_zero)
    rows = [
        ["figure", "process p50", "kubernetes p50", "kubernetes p90", "ratio / value", "target"],
        [
            "host create → serving (s)",
            f"{statistics.median(process_host):.3f}",
            f"{statistics.median(kube_host):.3f}",
            f"{p(kube_host, 0.9):.3f}",
            f"{host_ratio:.2f}×",
            f"≤ {TARGET_RATIO}×",
        ],
        [
            "Run create → Ready from zero (s)",
            f"{statistics.median(process_zero):.3f}",
            f"{statistics.median(kube_zero):.3f}",
            f"{p(kube_zero, 0.9):.3f}",
            f"{zero_ratio:.2f}×",
            f"≤ {TARGET_RATIO}×",
        ],
        [
            "pod deleted → Run answers 200 (s)",
            "—",
            f"{statistics.median(recovery):.3f}",
            f"{p(recovery, 0.9):.3f}",
            f"{statistics.median(recovery):.3f} s",
            f"≤ {TARGET_RECOVERY_S} s p50",
        ],
    ]
    for line in _benchlib.table(rows):
        print(line)
    result = {
        "bench": "kubernetes",
        "rounds": rounds,
        "host_create_s": {"process": process_host, "kubernetes": kube_host, "ratio_p50": host_ratio},
        "run_from_zero_s": {"process": process_zero, "kubernetes": kube_zero, "ratio_p50": zero_ratio},
        "pod_deleted_to_200_s": recovery,
    }
    _benchlib.print_json_line(result)
    ok = (
        host_ratio <= TARGET_RATIO
        and zero_ratio <= TARGET_RATIO
        and statistics.median(recovery) <= TARGET_RECOVERY_S
    )
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.rounds)))
