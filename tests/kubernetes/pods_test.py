"""The pods the provider builds: the platform's requirements merged over the template, every
one valid against the Kubernetes schema (strict), and a bad template named by its field."""

from __future__ import annotations

import pytest

from kruntimes.activities.hosts import kubernetes_pods as pods
from kruntimes.activities.hosts.kubernetes import KubernetesConfigError, validate_templates
from kruntimes.config.runtimes import KubernetesPodTemplate, PlatformConfigError, ResourceLimits, parse_config
from kruntimes.contracts.providers import HostSandbox
from kruntimes.runtime.sandbox.identity import UidRange
from tests.kubernetes.conftest import IMAGE, runtime, spec

FULL = KubernetesPodTemplate(
    image=IMAGE,
    imagePullPolicy="IfNotPresent",
    imagePullSecrets=["regcred"],
    resources={"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
    nodeSelector={"kubernetes.io/os": "linux"},
    tolerations=[{"key": "dedicated", "operator": "Equal", "value": "krt", "effect": "NoSchedule"}],
    affinity={
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["fn"]}]}
                ]
            }
        }
    },
    serviceAccountName="kruntimes-host",
    securityContext={"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000},
    containerSecurityContext={"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    priorityClassName="krt-hosts",
    labels={"team": "platform"},
    annotations={"example.com/owner": "platform"},
    env=[{"name": "LOG_FORMAT", "value": "json"}],
    volumes=[{"name": "cache", "emptyDir": {"sizeLimit": "1Gi"}}],
    volumeMounts=[{"name": "cache", "mountPath": "/cache"}],
)
TEMPLATES = {
    "minimal": KubernetesPodTemplate(image=IMAGE),
    "full": FULL,
    "token": KubernetesPodTemplate(image=IMAGE, automountServiceAccountToken=True),
}


@pytest.mark.parametrize("name", list(TEMPLATES))
@pytest.mark.parametrize("certificate", [None, "krt-host-{runtime}-{hostId}"])
@pytest.mark.parametrize("tenant", [None, "team-a"])
def test_every_pod_the_provider_builds_is_valid_kubernetes(name, certificate, tenant) -> None:
    settings = runtime(podTemplate=TEMPLATES[name], certificateSecret=certificate)
    host = spec(tenant=tenant, gateways=["gw-0.kruntimes:9444", "gw-1.kruntimes:9444"])
    pod = pods.build_pod(host, settings, control_plane="prod/kruntimes-pool")
    assert pods.schema_problems(pod) == []


def test_the_platform_decides_identity_labels_restarts_and_the_token() -> None:
    pod = pods.build_pod(spec(tenant="team-a"), runtime(podTemplate=FULL), control_plane="cp-a")
    meta, body = pod["metadata"], pod["spec"]
    assert meta["labels"] == {
        "team": "platform",
        "app.kubernetes.io/name": "kruntimes-host",
        "app.kubernetes.io/managed-by": "kruntimes",
        "kruntimes.io/runtime": "python",
        "kruntimes.io/host-id": "python-0",
        "kruntimes.io/tenant": "team-a",
        "kruntimes.io/control-plane": pods.control_plane_label("cp-a"),
    }
    assert meta["annotations"]["kruntimes.io/control-plane"] == "cp-a"
    assert meta["annotations"]["kruntimes.io/template-hash"] == pods.template_hash(pod)
    assert meta["name"] == pods.pod_name(control_plane="cp-a", runtime="python", host_id="python-0")
    assert body["restartPolicy"] == "Never" and body["automountServiceAccountToken"] is False
    assert body["serviceAccountName"] == "kruntimes-host" and body["enableServiceLinks"] is False
    [container] = body["containers"]
    assert container["command"] == ["krt", "host"]
    args = container["args"]
    assert args[args.index("--host-uid") + 1] == "$(KRT_POD_UID)"
    assert args[args.index("--listen") + 1] == "$(KRT_POD_IP):$(KRT_GRPC_PORT)"
    downward = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e
    }
    assert downward == {
        "KRT_POD_NAME": "metadata.name",
        "KRT_POD_NAMESPACE": "metadata.namespace",
        "KRT_POD_UID": "metadata.uid",
        "KRT_POD_IP": "status.podIP",
        "KRT_UID_RANGE": "metadata.annotations['kruntimes.io/uid-range']",
    }
    assert args[args.index("--uid-range") + 1] == "$(KRT_UID_RANGE)"
    # the uids are locked where the host may write: its own state volume
    assert args[args.index("--uid-lock-dir") + 1] == pods.UID_LOCK_DIR
    assert pods.UID_LOCK_DIR.startswith(args[args.index("--state-dir") + 1] + "/")
    # the host makes its state directory: the volume's root is world-writable (an emptyDir)
    [state] = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == pods.STATE_VOLUME]
    assert args[args.index("--state-dir") + 1].startswith(state + "/")
    assert container["securityContext"] == FULL.containerSecurityContext


@pytest.mark.parametrize(
    ("tenant", "group", "labels"),
    [
        (None, None, {}),
        ("team-a", None, {"kruntimes.io/tenant": "team-a"}),
        ("team-a", "grp", {"kruntimes.io/tenant": "team-a", "kruntimes.io/tenant-group": "grp"}),
    ],
)
def test_a_tenants_host_pod_is_labelled_with_its_tenant_and_tenant_group(tenant, group, labels) -> None:
    pod = pods.build_pod(spec(tenant=tenant, tenantGroup=group), runtime(), control_plane="cp-a")
    mine = {k: v for k, v in pod["metadata"]["labels"].items() if k.startswith("kruntimes.io/tenant")}
    assert mine == labels
    assert pods.schema_problems(pod) == []


def test_each_uid_slot_is_a_range_of_its_own_past_the_default_one() -> None:
    ranges = [UidRange.parse(pods.uid_range(slot)) for slot in (0, 1, pods.UID_SLOTS - 1)]
    assert [r.count for r in ranges] == [pods.UID_SLOT_SIZE] * 3
    assert ranges[0].first + ranges[0].count == ranges[1].first, "adjacent, not overlapping"
    default = UidRange()
    assert default.first + default.count <= ranges[0].first, "beyond the hosts' default range"
    assert ranges[-1].first + ranges[-1].count <= 2**31, "no uid a signed int misreads"
    with pytest.raises(ValueError):
        pods.uid_range(pods.UID_SLOTS)


def test_a_pods_uid_slot_is_an_annotation_that_leaves_its_template_hash_alone() -> None:
    pod = pods.build_pod(spec(), runtime(), control_plane="cp-a")
    assert pods.uid_slot(pod) is None
    slotted = pods.with_uid_slot(pod, 7)
    assert pods.uid_slot(slotted) == 7 and pods.uid_slot(pod) is None, "the pod given is left as it was"
    assert slotted["metadata"]["annotations"]["kruntimes.io/uid-range"] == pods.uid_range(7)
    assert pods.template_hash(slotted) == pods.template_hash(pod), "a restarted worker adopts it"
    assert pods.schema_problems(slotted) == []
    for text in (
        "",
        "7",
        f"{pods.UID_BASE + 1}-{pods.UID_BASE + pods.UID_SLOT_SIZE}",
        "2000000000-2000016383",
    ):
        slotted["metadata"]["annotations"]["kruntimes.io/uid-range"] = text
        assert pods.uid_slot(slotted) is None, text


@pytest.mark.parametrize(
    ("named", "secret_name"),
    [("krt-host-{runtime}-{hostId}", "krt-host-python-python-0"), (None, None)],
)
def test_the_certificate_secret_is_mounted_and_passed_to_the_host_by_flags(named, secret_name) -> None:
    """A named certificateSecret is mounted as it is; without one, the Secret the provider
    issues for this pod ({pod}-tls). Either way it is the host's --peer-tls directory."""
    pod = pods.build_pod(spec(), runtime(certificateSecret=named), control_plane="cp-a")
    secret_name = secret_name or pod["metadata"]["name"] + "-tls"
    [secret] = [v for v in pod["spec"]["volumes"] if "secret" in v]
    assert secret["secret"] == {"secretName": secret_name, "defaultMode": 0o400}
    container = pod["spec"]["containers"][0]
    assert {"name": secret["name"], "mountPath": pods.CERT_MOUNT, "readOnly": True} in container[
        "volumeMounts"
    ]
    args = container["args"]
    assert args[args.index("--peer-tls") + 1] == pods.CERT_MOUNT
    assert args[args.index("--assignment-public-key") + 1] == f"{pods.CERT_MOUNT}/assignments.pub"


def test_the_readiness_probe_asks_the_plaintext_health_port_not_the_mtls_one() -> None:
    container = pods.build_pod(spec(), runtime(), control_plane="cp-a")["spec"]["containers"][0]
    assert container["readinessProbe"]["grpc"]["port"] == pods.HEALTH_PORT != pods.GRPC_PORT
    args = container["args"]
    assert args[args.index("--health-listen") + 1] == "$(KRT_POD_IP):$(KRT_HEALTH_PORT)"
    assert {"name": "KRT_HEALTH_PORT", "value": str(pods.HEALTH_PORT)} in container["env"]


def test_the_host_gets_its_isolation_and_limits_by_flags() -> None:
    sandbox = HostSandbox(isolation="uid", network="none", limits=ResourceLimits(processes=17))
    args = pods.build_pod(spec(sandbox=sandbox), runtime(), control_plane="cp-a")["spec"]["containers"][0][
        "args"
    ]
    assert args[args.index("--isolation") + 1] == "uid"
    assert args[args.index("--network") + 1] == "none"
    assert args[args.index("--processes") + 1] == "17"


def test_the_issued_secret_is_owned_by_its_pod_and_holds_a_certificate_directory() -> None:
    pod = pods.build_pod(spec(), runtime(), control_plane="cp-a")
    pod["metadata"]["uid"] = "6c1f0e4a-5a57-4bb8-8d0e-4b8e7a0c2f11"
    files = {key: key.encode() for key in pods.CERT_KEYS}
    secret = pods.build_secret(spec(), control_plane="cp-a", namespace="ns", pod=pod, files=files)
    assert secret["metadata"]["name"] == pod["metadata"]["name"] + "-tls"
    [owner] = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Pod",
        pod["metadata"]["name"],
        pod["metadata"]["uid"],
    )
    assert sorted(secret["data"]) == sorted(["tls.crt", "tls.key", "ca.crt", "assignments.pub"])
    assert pods.schema_problems(secret) == []


def test_the_template_hash_follows_the_template_and_names_follow_the_control_plane() -> None:
    one = pods.build_pod(spec(), runtime(), control_plane="cp-a")
    same = pods.build_pod(spec(), runtime(), control_plane="cp-a")
    other = pods.build_pod(spec(), runtime(deleteGraceSeconds=9), control_plane="cp-a")
    key = "kruntimes.io/template-hash"
    assert one["metadata"]["annotations"][key] == same["metadata"]["annotations"][key]
    assert one["metadata"]["annotations"][key] != other["metadata"]["annotations"][key]
    theirs = pods.build_pod(spec(), runtime(), control_plane="cp-b")
    assert theirs["metadata"]["name"] != one["metadata"]["name"]


@pytest.mark.parametrize(
    ("template", "field"),
    [
        ({"resources": {"limits": {"cpu": "1"}, "requets": {}}}, "podTemplate.resources"),
        (
            {"tolerations": [{"key": "a", "operator": "Equal", "efect": "NoSchedule"}]},
            "podTemplate.tolerations[0]",
        ),
        ({"affinity": {"nodeAffinity": {"required": {}}}}, "podTemplate.affinity.nodeAffinity"),
        ({"securityContext": {"runAsUser": "root"}}, "podTemplate.securityContext.runAsUser"),
        ({"volumes": [{"name": "v", "hostpath": {"path": "/"}}]}, "podTemplate.volumes[0]"),
        (
            {"containerSecurityContext": {"privileged": "yes"}},
            "podTemplate.containerSecurityContext.privileged",
        ),
    ],
)
def test_a_bad_template_is_an_error_naming_its_field_before_any_pod_is_created(template, field) -> None:
    settings = runtime(podTemplate=KubernetesPodTemplate(image=IMAGE, **template))
    with pytest.raises(KubernetesConfigError) as caught:
        validate_templates({"python": settings}, control_plane="cp-a")
    assert f"runtimes[python].kubernetes.{field}" in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    ("kubernetes", "problem"),
    [
        ({"namespace": "ns", "podTemplate": {"imag": "x"}}, "runtimes.0.kubernetes.podTemplate.imag"),
        ({"namespace": "Not_A_Label", "podTemplate": {"image": "x"}}, "runtimes.0.kubernetes.namespace"),
        (
            {"namespace": "ns", "podTemplate": {"image": "x", "labels": {"kruntimes.io/runtime": "x"}}},
            "podTemplate.labels",
        ),
        (
            {
                "namespace": "ns",
                "podTemplate": {"image": "x", "env": [{"name": "KRT_POD_UID", "value": "x"}]},
            },
            "podTemplate.env",
        ),
        (
            {"namespace": "ns", "startTimeoutSeconds": 600, "podTemplate": {"image": "x"}},
            "startTimeoutSeconds",
        ),
        (
            {"namespace": "ns", "certificateSecret": "c-{pod}", "podTemplate": {"image": "x"}},
            "certificateSecret",
        ),
    ],
)
def test_the_runtimes_file_refuses_bad_kubernetes_settings_by_field(kubernetes, problem) -> None:
    with pytest.raises(PlatformConfigError) as caught:
        parse_config(
            {
                "runtimes": [
                    {
                        "name": "python",
                        "adapter": "python",
                        "provider": "kubernetes",
                        "kubernetes": kubernetes,
                    }
                ]
            }
        )
    assert problem in str(caught.value)


def test_provider_kubernetes_needs_its_block_and_other_providers_refuse_one() -> None:
    with pytest.raises(PlatformConfigError, match="runtimes.0.kubernetes"):
        parse_config({"runtimes": [{"name": "python", "adapter": "python", "provider": "kubernetes"}]})
    block = {"namespace": "ns", "podTemplate": {"image": "x"}}
    with pytest.raises(PlatformConfigError, match="only for provider kubernetes"):
        parse_config({"runtimes": [{"name": "python", "adapter": "python", "kubernetes": block}]})


def test_what_a_pod_status_says() -> None:
    def pod(**status):
        return {"metadata": {"name": "p", "uid": "u"}, "status": status}

    def waiting(reason):
        return pod(
            phase="Pending",
            containerStatuses=[{"name": "host", "state": {"waiting": {"reason": reason, "message": "m"}}}],
        )

    assert pods.assess(pod(phase="Pending")).state == "starting"
    assert pods.assess(waiting("ErrImagePull")).state == "starting", (
        "a pull error before its backoff may pass"
    )
    assert pods.assess(waiting("ImagePullBackOff")).reason is pods.FailureReason.ImagePullFailed
    assert pods.assess(waiting("InvalidImageName")).reason is pods.FailureReason.ImagePullFailed
    assert (
        pods.assess(pod(phase="Running", conditions=[{"type": "Ready", "status": "True"}])).state == "ready"
    )
    assert (
        pods.assess(pod(phase="Running", conditions=[{"type": "Ready", "status": "False"}])).state
        == "starting"
    )
    assert (
        pods.assess(pod(phase="Failed", reason="Evicted", message="low memory")).reason
        is pods.FailureReason.HostLost
    )
    assert pods.assess(pod(phase="Succeeded")).reason is pods.FailureReason.HostCrashed
    deleting = {
        "metadata": {"name": "p", "uid": "u", "deletionTimestamp": "2026-01-01T00:00:00Z"},
        "status": {},
    }
    assert pods.assess(deleting).reason is pods.FailureReason.HostLost


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_a_pod_with_the_host_injected_is_valid_kubernetes(name) -> None:
    settings = runtime(
        podTemplate=TEMPLATES[name], hostInjection={"image": IMAGE, "imagePullPolicy": "Always"}
    )
    pod = pods.build_pod(spec(), settings, control_plane="cp-a")
    assert pods.schema_problems(pod) == []
    [init] = pod["spec"]["initContainers"]
    assert (init["name"], init["image"], init["imagePullPolicy"]) == (pods.INSTALL_CONTAINER, IMAGE, "Always")
    assert init["command"] == ["krt", "install-host", pods.HOST_MOUNT]
    assert init["volumeMounts"] == [{"name": pods.HOST_VOLUME, "mountPath": pods.HOST_MOUNT}]
    [container] = pod["spec"]["containers"]
    assert container["image"] == TEMPLATES[name].image
    assert container["command"] == [f"{pods.HOST_MOUNT}/bin/krt", "host"]
    assert {"name": pods.HOST_VOLUME, "mountPath": pods.HOST_MOUNT, "readOnly": True} in container[
        "volumeMounts"
    ]
    assert {"name": pods.HOST_VOLUME, "emptyDir": {}} in pod["spec"]["volumes"]
    plain = pods.build_pod(spec(), runtime(podTemplate=TEMPLATES[name]), control_plane="cp-a")
    assert "initContainers" not in plain["spec"]
    assert pods.template_hash(plain) != pods.template_hash(pod), "injection is part of the template"
