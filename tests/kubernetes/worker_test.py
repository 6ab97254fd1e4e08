"""The worker's side of `provider: kubernetes`: its flags, what it checks before serving (a
schema-valid template, a loadable kubeconfig, an API that answers and lets it list pods), and the
pool probe that fences by the pod's own record."""

from __future__ import annotations

import signal
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime

import pytest
import yaml
from kmock import Response, namespace  # type: ignore[attr-defined]

from kruntimes.activities.host_manager import ProbeActivities
from kruntimes.activities.hosts import HostManager
from kruntimes.activities.hosts.kubernetes import KubernetesAccess, KubernetesConfigError, connect
from kruntimes.activities.hosts.registry import PROVIDERS
from kruntimes.config.runtimes import parse_config
from kruntimes.contracts.platform_info import PlatformInfo
from kruntimes.contracts.pool import ready_host
from kruntimes.contracts.run import ProbeInput
from kruntimes.temporal.connect import TemporalSettings
from kruntimes.workers.settings import WorkerSettings, provider_setup
from kruntimes.workers.worker import parse_args, settings_from
from tests.kubernetes.conftest import IMAGE, NAMESPACE, spec
from tests.support.pki import TestPKI
from tests.support.ports import refusing_port
from tests.support.waiting import eventually


def runtimes_file(tmp_path, **template) -> str:
    block = {"namespace": NAMESPACE, "podTemplate": {"image": IMAGE, **template}}
    path = tmp_path / "runtimes.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "runtimes": [
                    {"name": "python", "adapter": "python", "provider": "kubernetes", "kubernetes": block}
                ]
            }
        )
    )
    return str(path)


def trust_flags(pki: TestPKI, *, platform_ca: bool = True) -> list[str]:
    trust = pki.worker_trust()
    flags = ["--peer-tls", str(trust.peer_tls), "--assignment-key", str(trust.assignment_key)]
    return flags + (["--platform-ca", str(trust.platform_ca)] if platform_ca else [])


def test_the_worker_takes_kubeconfig_context_and_control_plane_flags(tmp_path, pki) -> None:
    args = parse_args(
        ["--state-dir", str(tmp_path), "--config", runtimes_file(tmp_path), "--kubeconfig", "/k/config"]
        + ["--kube-context", "prod", "--control-plane-id", "prod-eu", *trust_flags(pki)]
    )
    settings = settings_from(args)
    assert settings.provider_options == {
        "kubernetes": KubernetesAccess(kubeconfig="/k/config", context="prod")
    }
    assert settings.control_plane == "prod-eu"
    default = settings_from(
        parse_args(["--state-dir", str(tmp_path), "--pool-task-queue", "pools-b", *trust_flags(pki)])
    )
    assert default.provider_options == {} and default.control_plane == "default/pools-b"


def test_a_bad_pod_template_stops_the_worker_naming_the_field(tmp_path, pki) -> None:
    config = runtimes_file(tmp_path, resources={"limits": {"cpu": "1"}, "requets": {"cpu": "1"}})
    with pytest.raises(SystemExit) as caught:
        settings_from(parse_args(["--state-dir", str(tmp_path), "--config", config, *trust_flags(pki)]))
    assert "runtimes[python].kubernetes.podTemplate.resources" in str(caught.value)
    assert "requets" in str(caught.value)


def test_host_pods_without_a_way_to_get_certificates_stop_the_worker(tmp_path, pki) -> None:
    """No platform CA to issue host certificates and no certificateSecret: no pod could start."""
    config = ["--state-dir", str(tmp_path), "--config", runtimes_file(tmp_path)]
    with pytest.raises(SystemExit, match=r"runtimes python: host pods need certificates.*--platform-ca"):
        settings_from(parse_args([*config, *trust_flags(pki, platform_ca=False)]))
    path = tmp_path / "named.yaml"
    block = {"namespace": NAMESPACE, "certificateSecret": "krt-{hostId}", "podTemplate": {"image": IMAGE}}
    runtime = {"name": "python", "adapter": "python", "provider": "kubernetes", "kubernetes": block}
    path.write_text(yaml.safe_dump({"runtimes": [runtime]}))
    named = ["--state-dir", str(tmp_path), "--config", str(path), *trust_flags(pki, platform_ca=False)]
    assert settings_from(parse_args(named)).trust.platform_ca is None


def settings(tmp_path, access: KubernetesAccess, pki: TestPKI) -> WorkerSettings:
    block = {"namespace": NAMESPACE, "podTemplate": {"image": IMAGE}}
    return WorkerSettings(
        temporal=TemporalSettings(address="127.0.0.1:1"),
        config=parse_config(
            {
                "runtimes": [
                    {"name": "python", "adapter": "python", "provider": "kubernetes", "kubernetes": block}
                ]
            }
        ),
        platform=PlatformInfo(stateDir=str(tmp_path)),
        trust=pki.worker_trust(),
        provider_options={"kubernetes": access},
    )


def kubernetes_hosts(settings: WorkerSettings, pki: TestPKI) -> AbstractAsyncContextManager[object]:
    """The registered kubernetes provider, started as the worker starts it."""
    return PROVIDERS["kubernetes"].start(provider_setup(settings, issuer=pki.issuer()), client=None)


async def test_an_unreachable_api_stops_the_worker_before_it_serves(tmp_path, pki) -> None:
    with refusing_port() as port:
        access = KubernetesAccess(host=f"http://127.0.0.1:{port}")
        with pytest.raises(
            KubernetesConfigError, match=f"namespace {NAMESPACE}: cannot list pods: ApiUnavailable"
        ):
            async with kubernetes_hosts(settings(tmp_path, access, pki), pki):
                raise AssertionError("it must not get here")


async def test_a_worker_that_may_not_list_pods_does_not_start(env, tmp_path, pki) -> None:
    message = 'pods is forbidden: User "system:serviceaccount:krt:worker" cannot list resource "pods"'
    env.cluster["list", namespace(NAMESPACE)] << Response(
        status=403, payload={"kind": "Status", "code": 403, "message": message}
    )
    with pytest.raises(KubernetesConfigError, match="Forbidden"):
        access = KubernetesAccess(host=env.url)
        async with kubernetes_hosts(settings(tmp_path, access, pki), pki):
            raise AssertionError("it must not get here")


async def test_a_kubeconfig_that_cannot_be_loaded_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(KubernetesConfigError, match="cannot load the Kubernetes configuration"):
        await connect(KubernetesAccess(kubeconfig=str(tmp_path / "missing")))
    broken = tmp_path / "broken"
    broken.write_text("apiVersion: v1\nkind: Config\ncontexts: []\n")
    with pytest.raises(KubernetesConfigError):
        await connect(KubernetesAccess(kubeconfig=str(broken), context="nope"))


async def test_the_pool_probe_fences_a_kubernetes_host_by_its_pod(env) -> None:
    provider = env.provider()
    created = await provider.create(spec())
    host = ready_host(created, capacity=4, at=datetime.now(UTC))
    probe = ProbeActivities(HostManager([provider]))
    assert (await probe.probe_hosts(ProbeInput(hosts=[host], stateDir=""))).lost == []
    process = env.kubelet.process(env.pods()[0]["metadata"]["name"])
    process.send_signal(signal.SIGSTOP)  # unreachable but running is never proven gone
    try:
        assert (await probe.probe_hosts(ProbeInput(hosts=[host], stateDir=""))).lost == []
    finally:
        process.send_signal(signal.SIGCONT)
    await provider.delete(runtime="python", host_id=created.hostId, host_uid=created.hostUid)
    await eventually(lambda: not env.pods())
    assert (await probe.probe_hosts(ProbeInput(hosts=[host], stateDir=""))).lost == [created.hostUid]
