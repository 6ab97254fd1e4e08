"""`krt pki init-cluster`, the chart's hook Job without cert-manager, against kmock's Kubernetes
emulator with the real kubernetes-asyncio client: run with the rendered Job's own arguments, it
creates the platform's Secrets, keeps them on a second run, renews an expired certificate, rotates
a due CA in two phases (its clock injected), and refuses a Secret of the same name it does not own; the
certificates name the identities and usages the code expects, load with the worker's and the
gateway's real loaders from the paths the chart mounts them at, and shake hands; and the API calls
it made are exactly its Role in the chart."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.x509.oid import ExtendedKeyUsageOID
from kmock import Server

from kruntimes.pki import Authority, Identity, PeerTLS, Role, identity_of
from kruntimes.pki import cluster as pki
from kruntimes.pki import rotation as ca_rotation
from kruntimes.pki.assignments import Verifier
from kruntimes.workers import gateway as gateway_main
from kruntimes.workers import pki as pki_command
from kruntimes.workers import pki_secrets
from kruntimes.workers import settings as worker_settings
from kruntimes.workers import worker as worker_main
from tests.helm.conftest import NAMESPACE, ROOT, Rendered, pod_spec, rendered
from tests.kubernetes.cluster import Cluster
from tests.kubernetes.verbs import VERB_OF
from tests.trust.assignment_data import ASSIGNMENT

CASE = "no-cert-manager"
COMMAND_S = 60.0


@dataclass
class Env:
    cluster: Cluster
    server: Server
    chart: Rendered

    @property
    def url(self) -> str:
        return str(self.server.url).rstrip("/")

    def job_args(self) -> list[str]:
        container = pod_spec(self.chart.one("Job", "-pki-init"))["containers"][0]
        assert container["command"] == ["krt", "pki", "init-cluster"]
        return [str(a) for a in container["args"]]

    async def krt_pki(self, *extra: str) -> subprocess.CompletedProcess[str]:
        """The hook Job's command line, as a process, against the emulator."""
        argv = [
            sys.executable,
            "-m",
            "kruntimes.workers.krt",
            "pki",
            "init-cluster",
            *self.job_args(),
            *extra,
        ]
        argv += ["--api-server", self.url]
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
        return await asyncio.to_thread(
            subprocess.run, argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=COMMAND_S
        )

    def secret(self, name: str) -> dict[str, Any]:
        found = self.cluster.secret(NAMESPACE, name)
        assert found is not None, f"no secret {name}"
        return found

    def files(self, name: str) -> dict[str, bytes]:
        return {k: base64.b64decode(v) for k, v in (self.secret(name).get("data") or {}).items()}


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async with Cluster() as cluster, Server(cluster) as server:
        yield Env(cluster, server, rendered(CASE))


def names(chart: Rendered) -> dict[str, str]:
    fullname = chart.one("Job", "-pki-init")["metadata"]["name"].removesuffix("-pki-init")
    return {
        "ca": f"{fullname}-platform-ca",
        "worker": f"{fullname}-worker-peer",
        "gateway": f"{fullname}-gateway-peer",
        "assignment": f"{fullname}-assignment-key",
    }


def certificate(files: dict[str, bytes]) -> x509.Certificate:
    return x509.load_pem_x509_certificate(files["tls.crt"])


def usages(cert: x509.Certificate) -> set[x509.ObjectIdentifier]:
    return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def mount(chart: Rendered, kind: str, suffix: str, env: Env, root: Path) -> list[str]:
    """Write each secret volume of the workload as the kubelet would (its items, else every key)
    under `root`, and answer its container's args with the mount paths moved there."""
    spec = pod_spec(chart.one(kind, suffix))
    container = spec["containers"][0]
    volumes = {v["name"]: v for v in spec["volumes"]}
    moved: dict[str, Path] = {}
    for m in container["volumeMounts"]:
        source = volumes[m["name"]].get("secret")
        directory = root / m["name"]
        directory.mkdir(parents=True, exist_ok=True)
        moved[m["mountPath"]] = directory
        if source is None or source["secretName"] not in names(chart).values():
            continue
        files = env.files(source["secretName"])
        for item in source.get("items") or [{"key": k, "path": k} for k in files]:
            (directory / item["path"]).write_bytes(files[item["key"]])
            (directory / item["path"]).chmod(0o600)

    def moved_arg(arg: str) -> str:
        for path, directory in moved.items():
            if arg == path or arg.startswith(path.rstrip("/") + "/"):
                return str(directory) + arg[len(path.rstrip("/")) :]
        return arg

    return [moved_arg(str(a)) for a in container["args"]]


async def test_the_hook_job_creates_the_secrets_once_and_keeps_them(env: Env, tmp_path: Path) -> None:
    secrets = names(env.chart)
    first = await env.krt_pki()
    assert first.returncode == 0, first.stderr
    assert sorted(first.stdout.splitlines()) == sorted(
        f"secret {NAMESPACE}/{name}: created" for name in secrets.values()
    )
    created = {name: env.secret(name) for name in secrets.values()}
    for secret in created.values():
        assert secret["type"] == "kubernetes.io/tls"
        assert secret["metadata"]["labels"][pki.MANAGED_BY_LABEL] == pki.MANAGED_BY
        assert secret["metadata"]["annotations"][pki.OWNER_ANNOTATION] == f"{NAMESPACE}/krt"
        assert "PRIVATE KEY" not in first.stdout + first.stderr

    second = await env.krt_pki()
    assert second.returncode == 0, second.stderr
    assert sorted(second.stdout.splitlines()) == sorted(
        f"secret {NAMESPACE}/{name}: kept" for name in secrets.values()
    )
    assert {name: env.secret(name)["data"] for name in secrets.values()} == {
        name: s["data"] for name, s in created.items()
    }

    # what the certificates say
    ca = certificate(env.files(secrets["ca"]))
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for part, role, wanted in (
        ("worker", Role.CONTROL_PLANE, {ExtendedKeyUsageOID.CLIENT_AUTH}),
        ("gateway", Role.GATEWAY, {ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH}),
    ):
        files = env.files(secrets[part])
        cert = certificate(files)
        identity = identity_of(cert)
        assert identity.role is role and identity.name == secrets[part].removesuffix("-peer")
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert sans.get_values_for_type(x509.UniformResourceIdentifier) == [
            f"spiffe://kruntimes.io/{role}/{identity.name}"
        ]
        assert identity.dns_name in sans.get_values_for_type(x509.DNSName)
        assert usages(cert) == wanted
        cert.verify_directly_issued_by(ca)
        assert files["ca.crt"] == env.files(secrets["ca"])["tls.crt"]
        lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
        assert dt.timedelta(days=90) <= lifetime <= dt.timedelta(days=90, minutes=1)  # the ci values
    assignment = certificate(env.files(secrets["assignment"]))
    assert isinstance(assignment.public_key(), Ed25519PublicKey)

    # the worker's and the gateway's own loaders, from where the chart mounts the Secrets
    worker_args = worker_main.parse_args(mount(env.chart, "Deployment", "-worker", env, tmp_path / "worker"))
    trust = worker_settings.WorkerTrust(
        peer_tls=worker_args.peer_tls,
        assignment_key=worker_args.assignment_key,
        platform_ca=worker_args.platform_ca,
        host_certificate_lifetime=dt.timedelta(seconds=worker_args.host_certificate_lifetime),
    )
    worker_tls, signer, issuer = worker_settings.load_trust(trust)
    assert issuer is not None and issuer.authority.cert == ca
    assert worker_tls.identity == Identity.control_plane(secrets["worker"].removesuffix("-peer"))
    gateway_args = gateway_main.parse_args(mount(env.chart, "Deployment", "-gateway", env, tmp_path / "gw"))
    gateway_tls = PeerTLS(gateway_args.peer_tls, role=Role.GATEWAY)
    verifier = Verifier.load(gateway_args.assignment_public_key)
    assert verifier.verify(signer.sign(ASSIGNMENT)) == ASSIGNMENT
    # and a host certificate the worker issues from this CA is trusted by the gateway
    host_files = issuer.files(runtime="python", host_id="python-0")
    assert x509.load_pem_x509_certificate(host_files["tls.crt"]).verify_directly_issued_by(ca) is None
    await handshake(server=gateway_tls, client=worker_tls, expect=gateway_tls.identity)


async def handshake(*, server: PeerTLS, client: PeerTLS, expect: Identity) -> None:
    """A mutual TLS connection on 127.0.0.1 between the two; the server sees the client's identity."""
    seen: asyncio.Future[object] = asyncio.get_running_loop().create_future()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.set_result(writer.get_extra_info("peercert"))
        writer.close()

    listener = await asyncio.start_server(accept, "127.0.0.1", 0, ssl=server.server_context())
    try:
        port = listener.sockets[0].getsockname()[1]
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(
                "127.0.0.1", port, ssl=client.client_context(), server_hostname=expect.dns_name
            ),
            10,
        )
        peer = await asyncio.wait_for(seen, 10)
        writer.close()
    finally:
        listener.close()
        await listener.wait_closed()
    uris = [v for kind, v in peer.get("subjectAltName", ()) if kind == "URI"]  # type: ignore[attr-defined]
    assert uris == [client.identity.uri]


async def test_an_expired_certificate_is_renewed_and_the_others_kept(env: Env) -> None:
    secrets = names(env.chart)
    assert (await env.krt_pki()).returncode == 0
    ca = Authority(
        certificate(env.files(secrets["ca"])),
        pki._read_ca(env.secret(secrets["ca"])).key,  # type: ignore[union-attr]
    )
    identity = identity_of(certificate(env.files(secrets["worker"])))
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=3)
    expired = ca.issue(identity, lifetime=dt.timedelta(days=1), now=past)
    api = await pki_secrets.connect(api_server=env.url)
    try:
        current = env.secret(secrets["worker"])
        data = {"tls.crt": expired.cert_pem, "tls.key": expired.key_pem, "ca.crt": ca.cert_pem}
        patch = {"data": {k: base64.b64encode(v).decode() for k, v in data.items()}}
        assert await pki_secrets.SecretApi(api).patch(NAMESPACE, current["metadata"]["name"], patch)
    finally:
        await api.close()
    gateway_before = env.secret(secrets["gateway"])["data"]

    again = await env.krt_pki()
    assert again.returncode == 0, again.stderr
    assert f"secret {NAMESPACE}/{secrets['worker']}: renewed" in again.stdout.splitlines()
    assert f"secret {NAMESPACE}/{secrets['gateway']}: kept" in again.stdout.splitlines()
    renewed = certificate(env.files(secrets["worker"]))
    assert renewed.not_valid_after_utc > dt.datetime.now(dt.UTC) + dt.timedelta(days=80)
    assert identity_of(renewed) == identity
    assert env.secret(secrets["gateway"])["data"] == gateway_before


async def run_at(env: Env, when: dt.datetime, *extra: str) -> dict[str, pki.Outcome]:
    """The hook Job's command as of `when` (its clock injected), in this process."""
    plan = pki_command.plan_from(
        pki_command.cluster_parser().parse_args(["init-cluster", *env.job_args(), *extra])
    )
    api = await pki_secrets.connect(api_server=env.url)
    try:
        return await pki.ClusterPki(pki_secrets.SecretApi(api), plan, now=when).run()
    finally:
        await api.close()


def bundle_of(files: dict[str, bytes]) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(files["ca.crt"])


async def test_a_due_ca_rotates_in_two_phases_and_the_old_one_is_dropped_last(
    env: Env, tmp_path: Path
) -> None:
    secrets = names(env.chart)
    assert (await env.krt_pki()).returncode == 0
    old_ca = certificate(env.files(secrets["ca"]))
    old_assignment = env.files(secrets["assignment"])["tls.key"]
    plan = pki_command.plan_from(pki_command.cluster_parser().parse_args(["init-cluster", *env.job_args()]))
    span = ca_rotation.overlap(plan.max_leaf_lifetime)
    assert plan.max_leaf_lifetime == dt.timedelta(days=90)  # the ci values' leaves outlive the hosts'

    def leaves_signed_by(ca: x509.Certificate) -> None:
        for part in ("worker", "gateway"):
            certificate(env.files(secrets[part])).verify_directly_issued_by(ca)
            assert env.files(secrets[part])["ca.crt"] == env.files(secrets["ca"])["ca.crt"], part

    # phase 1, once the CA is due: a next CA in every bundle, the current one still signs
    due = ca_rotation.rotation_due(old_ca, plan.max_leaf_lifetime) + dt.timedelta(seconds=1)
    assert await run_at(env, due) == {
        secrets["ca"]: pki.Outcome.RENEWED,
        secrets["worker"]: pki.Outcome.RENEWED,  # their ca.crt is no longer the bundle
        secrets["gateway"]: pki.Outcome.RENEWED,
        secrets["assignment"]: pki.Outcome.KEPT,
    }
    assert certificate(env.files(secrets["ca"])) == old_ca
    old, new_ca = bundle_of(env.files(secrets["ca"]))
    assert old == old_ca and new_ca.public_key() != old_ca.public_key()
    leaves_signed_by(old_ca)
    # the worker, from where the chart mounts the CA Secret, issues hosts the two-CA bundle
    worker_args = worker_main.parse_args(mount(env.chart, "Deployment", "-worker", env, tmp_path / "w"))
    _, _, issuer = worker_settings.load_trust(
        worker_settings.WorkerTrust(
            peer_tls=worker_args.peer_tls,
            assignment_key=worker_args.assignment_key,
            platform_ca=worker_args.platform_ca,
        )
    )
    assert issuer is not None and issuer.authority.cert == old_ca
    host = issuer.files(runtime="python", host_id="python-0")
    assert host["ca.crt"] == env.files(secrets["ca"])["ca.crt"]
    # the same run again changes nothing, and the CA stays as it is until the overlap has passed
    data = {name: env.secret(name)["data"] for name in secrets.values()}
    assert set((await run_at(env, due)).values()) == {pki.Outcome.KEPT}
    assert {name: env.secret(name)["data"] for name in secrets.values()} == data
    early = await run_at(env, due + span - dt.timedelta(seconds=2))  # the leaves came due meanwhile
    assert (
        early[secrets["ca"]] == pki.Outcome.KEPT and env.secret(secrets["ca"])["data"] == data[secrets["ca"]]
    )

    # phase 2, after the overlap: the next CA signs, the old one stays trusted
    switch = due + span
    outcomes = await run_at(env, switch)
    assert outcomes[secrets["ca"]] == outcomes[secrets["worker"]] == pki.Outcome.RENEWED
    assert certificate(env.files(secrets["ca"])) == new_ca
    assert bundle_of(env.files(secrets["ca"])) == [new_ca, old_ca]
    leaves_signed_by(new_ca)
    assert set((await run_at(env, switch)).values()) == {pki.Outcome.KEPT}

    # and once nothing the old CA signed can be valid, it leaves every bundle
    assert (await run_at(env, switch + span - dt.timedelta(seconds=2)))[secrets["ca"]] == pki.Outcome.KEPT
    assert bundle_of(env.files(secrets["ca"])) == [new_ca, old_ca]
    outcomes = await run_at(env, switch + span)
    assert outcomes[secrets["ca"]] == outcomes[secrets["gateway"]] == pki.Outcome.RENEWED
    assert bundle_of(env.files(secrets["ca"])) == [new_ca]
    leaves_signed_by(new_ca)
    assert env.files(secrets["assignment"])["tls.key"] == old_assignment  # the key is never replaced


async def test_rotate_ca_starts_a_rotation_now_and_only_once(env: Env) -> None:
    secrets = names(env.chart)
    first = await env.krt_pki("--rotate-ca")
    assert first.returncode == 0, first.stderr
    assert "platform CA rotation: published the next CA in every bundle" in first.stderr
    assert len(bundle_of(env.files(secrets["ca"]))) == 2
    data = {name: env.secret(name)["data"] for name in secrets.values()}
    again = await env.krt_pki("--rotate-ca")  # a rotation under way: nothing more
    assert again.returncode == 0, again.stderr
    assert sorted(again.stdout.splitlines()) == sorted(
        f"secret {NAMESPACE}/{n}: kept" for n in secrets.values()
    )
    assert {name: env.secret(name)["data"] for name in secrets.values()} == data


async def test_an_unreadable_rotation_state_is_refused_and_the_ca_kept(env: Env) -> None:
    secrets = names(env.chart)
    assert (await env.krt_pki("--rotate-ca")).returncode == 0
    state = env.files(secrets["ca"])[pki.STATE_KEY]
    api = await pki_secrets.connect(api_server=env.url)
    try:
        current = env.secret(secrets["ca"])
        patch = {"data": {pki.STATE_KEY: base64.b64encode(state[: len(state) // 2]).decode()}}
        assert await pki_secrets.SecretApi(api).patch(NAMESPACE, current["metadata"]["name"], patch)
    finally:
        await api.close()
    before = {name: env.secret(name)["data"] for name in secrets.values()}
    refused = await env.krt_pki()
    assert refused.returncode == 1
    assert f"secret {NAMESPACE}/{secrets['ca']}: the CA state is not JSON" in refused.stderr
    assert "refusing to replace the CA" in refused.stderr and "PRIVATE KEY" not in refused.stderr
    assert {name: env.secret(name)["data"] for name in secrets.values()} == before


async def test_a_secret_of_the_same_name_it_does_not_own_is_refused(env: Env) -> None:
    secrets = names(env.chart)
    foreign = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": secrets["gateway"], "namespace": NAMESPACE, "labels": {"team": "other"}},
        "data": {"tls.crt": base64.b64encode(b"theirs").decode(), "tls.key": ""},
    }
    api = await pki_secrets.connect(api_server=env.url)
    try:
        assert await pki_secrets.SecretApi(api).create(NAMESPACE, foreign)
    finally:
        await api.close()
    refused = await env.krt_pki()
    assert refused.returncode == 1
    assert f"secret {NAMESPACE}/{secrets['gateway']} exists and is not managed by krt pki" in refused.stderr
    assert pki.OWNER_ANNOTATION in refused.stderr
    # nothing was written: not the foreign Secret, and none of the others
    assert env.secret(secrets["gateway"])["data"] == foreign["data"]
    assert [env.cluster.secret(NAMESPACE, secrets[p]) for p in ("ca", "worker", "assignment")] == [None] * 3


async def test_the_api_calls_it_makes_are_exactly_its_role_in_the_chart(env: Env) -> None:
    secrets = names(env.chart)
    assert (await env.krt_pki()).returncode == 0
    plan = pki_command.plan_from(pki_command.cluster_parser().parse_args(["init-cluster", *env.job_args()]))
    # past two thirds of even the assignment key's century-long certificate: every Secret patched
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=36500 * 2 // 3 + 1)
    api = await pki_secrets.connect(api_server=env.url)
    try:
        await pki.ClusterPki(pki_secrets.SecretApi(api), plan, now=later).run()
    finally:
        await api.close()
    assert (await env.krt_pki()).returncode == 0

    ours = [r for r in list(env.cluster) if r.headers.get("User-Agent", "").startswith("OpenAPI-Generator")]
    called: dict[str, set[str | None]] = {}
    for r in ours:
        assert r.resource is not None and r.resource.plural == "secrets", r
        assert r.namespace == NAMESPACE
        called.setdefault(VERB_OF[r.action], set()).add(r.name)
    assert set(called) == set(pki.VERBS)
    role = env.chart.one("Role", "-pki-init")
    rules = {tuple(sorted(r["verbs"])): r for r in role["rules"]}
    assert set(rules) == {("get", "patch"), ("create",)}
    for verb in ("get", "patch"):
        assert called[verb] == set(rules[("get", "patch")]["resourceNames"]) == set(secrets.values())
    assert "resourceNames" not in rules[("create",)]  # a create cannot be narrowed by name
    for rule in role["rules"]:
        assert rule["apiGroups"] == [""] and rule["resources"] == ["secrets"]
    # the install hook Job and the renewal CronJob: the same command, each bound to such a Role
    for kind, suffix in (("Job", "-pki-init"), ("CronJob", "-pki-renew")):
        pod = pod_spec(env.chart.one(kind, suffix))
        assert pod["containers"][0]["args"] == env.job_args()
        (binding,) = [b for b in env.chart.of("RoleBinding") if b["metadata"]["name"].endswith(suffix)]
        assert env.chart.one("Role", suffix)["rules"] == role["rules"]
        assert binding["roleRef"]["name"] == env.chart.one("Role", suffix)["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE}
        ]


def test_the_job_is_rendered_only_without_cert_manager_and_existing_secrets() -> None:
    for case in ("default", "cert-manager", "existing-tls"):
        pki_docs = [d for d in rendered(case).docs if "-pki-" in d["metadata"]["name"]]
        assert not pki_docs, case
    chart = rendered(CASE)
    hooks = {
        d["kind"]: d["metadata"]["annotations"]
        for d in chart.docs
        if d["metadata"]["name"].endswith("-pki-init") and d["kind"] != "NetworkPolicy"
    }
    assert set(hooks) == {"ServiceAccount", "Role", "RoleBinding", "Job"}
    for kind, hook in hooks.items():
        assert hook["helm.sh/hook"] == "pre-install,pre-upgrade", kind
        # the account and its rights exist before the Job runs
        assert int(hook["helm.sh/hook-weight"]) < 0
    assert int(hooks["Job"]["helm.sh/hook-weight"]) > int(hooks["Role"]["helm.sh/hook-weight"])
    assert not chart.of("Certificate") and not [
        s for s in chart.of("Secret") if s["metadata"]["name"].endswith("-assignment-key")
    ]


def test_the_pki_pods_may_reach_only_the_api_server_and_dns() -> None:
    chart = rendered(CASE)
    policy = chart.one("NetworkPolicy", "-pki-init")["spec"]
    worker = chart.one("NetworkPolicy", "-worker")["spec"]
    for kind, suffix in (("Job", "-pki-init"), ("CronJob", "-pki-renew")):
        workload = chart.one(kind, suffix)
        template = workload["spec"]["jobTemplate"] if kind == "CronJob" else workload
        labels = template["spec"]["template"]["metadata"]["labels"]
        assert policy["podSelector"]["matchLabels"].items() <= labels.items()
        assert not worker["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in policy
    dns, api = policy["egress"]
    assert "to" not in dns and {p["port"] for p in dns["ports"]} == {53}
    assert api == next(rule for rule in worker["egress"] if rule.get("to") == api["to"])
