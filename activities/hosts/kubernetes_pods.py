"""Host pods as data: the pod the kubernetes provider builds for a host, and what a pod's status
says about that host. Pure functions on the JSON form of pods (no Kubernetes client here).

A host pod is the runtime's pod template merged with what the platform requires, which always wins:
its labels (``app.kubernetes.io/name``, ``app.kubernetes.io/managed-by: kruntimes``,
``kruntimes.io/runtime``, ``kruntimes.io/host-id``, ``kruntimes.io/tenant`` and
``kruntimes.io/tenant-group`` for a tenant's own capacity, ``kruntimes.io/control-plane`` for
selecting), its annotations (the owning control plane's id, the template hash), one container
``host`` running ``krt host`` with its identity from the downward API (pod name, namespace, uid,
IP), ``restartPolicy: Never`` (a host that exits is a lost host: a restarted container would come
back under the same uid without its registrations), no service account token unless the template
asks, and no service links. The host reads its role bindings from ``ROLE_BINDINGS_FILE``, which the
template mounts (the chart does).

The pod's name is ``{hostId}-{8 hex}``, the hex naming (control plane, runtime): two control planes
on one namespace never share a pod name.

Every host pod gets a uid range of its own for its functions (annotation ``kruntimes.io/uid-range``,
which the host reads through the downward API): one of ``UID_SLOTS`` slots of ``UID_SLOT_SIZE`` uids
from ``UID_BASE``, never one another host pod of its namespaces holds (the provider picks it). Pods
do not share a uid lock directory (each locks its uids in its own state volume), and uids are the
node kernel's: two pods of one node handing out the same uid would share its per-uid limits
(processes, inotify instances, signals) and whatever it may write on a volume both mount. A pod
with ``hostUsers: false`` takes its functions' uids from ``USERNS_UID_RANGE`` instead: uids of its
own user namespace, which the kubelet maps to node uids no other pod has.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import kubernetes_validate

from kruntimes.activities.hosts.process import host_flags
from kruntimes.config.runtimes import KubernetesRuntime
from kruntimes.contracts.providers import HostSpec
from kruntimes.decisions.scheduling.failures import FailureReason
from kruntimes.pki import ASSIGNMENT_PUBLIC_KEY, CA_CERT, TLS_CERT, TLS_KEY

APP_NAME = "kruntimes-host"
MANAGED_BY = "kruntimes"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_RUNTIME = "kruntimes.io/runtime"
LABEL_HOST_ID = "kruntimes.io/host-id"
LABEL_TENANT = "kruntimes.io/tenant"
LABEL_TENANT_GROUP = "kruntimes.io/tenant-group"
LABEL_CONTROL_PLANE = "kruntimes.io/control-plane"
ANNOTATION_CONTROL_PLANE = "kruntimes.io/control-plane"
ANNOTATION_TEMPLATE_HASH = "kruntimes.io/template-hash"
# What every list and watch of the provider asks the API server for (then checked again here).
SELECTOR = f"{LABEL_NAME}={APP_NAME},{LABEL_MANAGED_BY}={MANAGED_BY}"

CONTAINER = "host"
GRPC_PORT_NAME, GRPC_PORT = "grpc", 50051
INVOKE_PORT_NAME, INVOKE_PORT = "invoke", 50052
# Plaintext, grpc.health.v1 Check only: the kubelet's gRPC probe cannot present a certificate.
HEALTH_PORT_NAME, HEALTH_PORT = "health", 50053
# The liveness probe on that port: a host is ended after LIVENESS_FAILURES checks in a row, one
# every LIVENESS_PERIOD_S, unanswered within LIVENESS_TIMEOUT_S.
LIVENESS_PERIOD_S, LIVENESS_TIMEOUT_S, LIVENESS_FAILURES = 10, 5, 6
STATE_VOLUME, STATE_MOUNT = "krt-state", "/var/lib/kruntimes"
# The host's state directory: a directory the host makes in its state volume, not the volume's
# root, which a kubelet makes world-writable (an emptyDir is 0777) — where functions that share the
# pod's mounts could plant files (a Run's secrets) before the host makes them.
STATE_DIR = f"{STATE_MOUNT}/host"
# Where the host locks the uids it hands out: in its state directory (the root file system is
# read-only, and the range is the pod's own, so no other host shares the locks).
UID_LOCK_DIR = f"{STATE_DIR}/uids"
ANNOTATION_UID_RANGE = "kruntimes.io/uid-range"
# Past the default range of hosts that are not pods (2000000000 + 100000), so a node's own hosts
# never share a uid with a pod's, and below 2**31, so no program that keeps a uid in a signed int
# misreads one.
UID_BASE, UID_SLOT_SIZE, UID_SLOTS = 2_100_000_000, 8_192, 5_796
# A pod with a user namespace of its own (hostUsers: false) has 65,536 uids of the node mapped
# (0-65535, a range no other pod shares): its functions take theirs from these, below nobody.
USERNS_UID_RANGE = "10000-65533"
CERT_VOLUME, CERT_MOUNT = "krt-certificate", "/etc/kruntimes/tls"
# Where the host reads its role bindings (`use-secrets`: whose Runs get which secret): a directory
# the runtime's pod template mounts read-only (the chart: a ConfigMap, whose updates reach the
# host as no subPath mount's would), not in the state directory the host makes; without it no Run
# of the pod gets a secret.
ROLE_BINDINGS_MOUNT = "/etc/kruntimes/role-bindings"
ROLE_BINDINGS_FILE = f"{ROLE_BINDINGS_MOUNT}/rolebindings.yaml"
# With a runtime's hostInjection: the emptyDir the init container installs the host into.
HOST_VOLUME, HOST_MOUNT = "krt-host", "/opt/krt-host"
INSTALL_CONTAINER = "install-host"
# The host's certificate Secret holds a certificate directory (kruntimes/pki/issuer.py): tls.crt,
# tls.key, ca.crt and assignments.pub; mounted as it is, it is `--peer-tls`.
CERT_KEYS = (TLS_CERT, TLS_KEY, CA_CERT, ASSIGNMENT_PUBLIC_KEY)
# The downward API: who the host is, as Kubernetes knows it.
DOWNWARD_ENV = (
    ("KRT_POD_NAME", "metadata.name"),
    ("KRT_POD_NAMESPACE", "metadata.namespace"),
    ("KRT_POD_UID", "metadata.uid"),
    ("KRT_POD_IP", "status.podIP"),
    ("KRT_UID_RANGE", f"metadata.annotations['{ANNOTATION_UID_RANGE}']"),
)
MAX_CONTROL_PLANE_ID = 253
_CONTROL_PLANE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]*")
# The schema every built pod is checked against: the newest the validator bundles.
SCHEMA_VERSION: str = kubernetes_validate.latest_version()

# Container waiting reasons that say the image will not come (after the kubelet's pull backoff).
_IMAGE_FAILURES = frozenset({"ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
# Waiting reasons that only say "not yet".
_STARTING = frozenset({"ContainerCreating", "PodInitializing"})


def check_control_plane_id(value: str) -> str:
    if not 1 <= len(value) <= MAX_CONTROL_PLANE_ID or not _CONTROL_PLANE_ID.fullmatch(value):
        raise ValueError(
            f"control plane id: 1..{MAX_CONTROL_PLANE_ID} of [A-Za-z0-9._/:-], starting with a letter "
            f"or digit: {value!r:.80}"
        )
    return value


def control_plane_label(control_plane: str) -> str:
    """The control plane as a label value (its id may not be one): 16 hex of its hash."""
    return hashlib.sha256(control_plane.encode()).hexdigest()[:16]


def uid_range(slot: int) -> str:
    """The uids of a slot, as `krt host --uid-range` takes them (FIRST-LAST)."""
    if not 0 <= slot < UID_SLOTS:
        raise ValueError(f"uid slot {slot} is not in [0, {UID_SLOTS})")
    first = UID_BASE + slot * UID_SLOT_SIZE
    return f"{first}-{first + UID_SLOT_SIZE - 1}"


def uid_slot(pod: dict[str, Any]) -> int | None:
    """The slot a pod's uid-range annotation names, or None (none, or not one of the slots)."""
    text = PodFacts.of(pod).annotations.get(ANNOTATION_UID_RANGE, "")
    first, _, last = text.partition("-")
    if not first.isdigit() or not last.isdigit():
        return None
    slot, offset = divmod(int(first) - UID_BASE, UID_SLOT_SIZE)
    if offset or not 0 <= slot < UID_SLOTS or uid_range(slot) != text:
        return None
    return slot


def with_uid_slot(pod: dict[str, Any], slot: int) -> dict[str, Any]:
    """The pod, its functions given the uids of `slot` (the template hash stays: which range a pod
    got is not part of its template)."""
    annotations = {**pod["metadata"]["annotations"], ANNOTATION_UID_RANGE: uid_range(slot)}
    return {**pod, "metadata": {**pod["metadata"], "annotations": annotations}}


def pod_name(*, control_plane: str, runtime: str, host_id: str) -> str:
    digest = hashlib.sha256(f"{control_plane}\0{runtime}".encode()).hexdigest()[:8]
    return f"{host_id}-{digest}"


def platform_selector(control_plane: str) -> str:
    return f"{SELECTOR},{LABEL_CONTROL_PLANE}={control_plane_label(control_plane)}"


def certificate_secret(spec: HostSpec, settings: KubernetesRuntime, *, control_plane: str) -> str:
    """The Secret a host pod mounts its certificate from: the runtime's `certificateSecret`
    (provisioned by the operator), else the one the provider issues, `{pod name}-tls`."""
    named = settings.certificate_secret(runtime=spec.runtime, host_id=spec.hostId)
    if named is not None:
        return named
    return pod_name(control_plane=control_plane, runtime=spec.runtime, host_id=spec.hostId) + "-tls"


def _platform_labels(spec: HostSpec, *, control_plane: str) -> dict[str, str]:
    labels = {
        LABEL_NAME: APP_NAME,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_RUNTIME: spec.runtime,
        LABEL_HOST_ID: spec.hostId,
        LABEL_CONTROL_PLANE: control_plane_label(control_plane),
    }
    if spec.tenant is not None:
        labels[LABEL_TENANT] = spec.tenant
    if spec.tenantGroup is not None:
        labels[LABEL_TENANT_GROUP] = spec.tenantGroup
    return labels


def build_secret(
    spec: HostSpec, *, control_plane: str, namespace: str, pod: dict[str, Any], files: dict[str, bytes]
) -> dict[str, Any]:
    """The certificate Secret the provider issues for a host pod, owned by that pod (the
    garbage collector deletes it with the pod)."""
    name = pod_name(control_plane=control_plane, runtime=spec.runtime, host_id=spec.hostId) + "-tls"
    owner = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": pod["metadata"]["name"],
        "uid": pod["metadata"]["uid"],
        "blockOwnerDeletion": False,
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": _platform_labels(spec, control_plane=control_plane),
            "annotations": {ANNOTATION_CONTROL_PLANE: control_plane},
            "ownerReferences": [owner],
        },
        "data": {key: base64.b64encode(files[key]).decode() for key in CERT_KEYS},
    }


def build_pod(spec: HostSpec, settings: KubernetesRuntime, *, control_plane: str) -> dict[str, Any]:
    """The pod of one host, with its template hash annotation set."""
    template = settings.podTemplate
    name = pod_name(control_plane=control_plane, runtime=spec.runtime, host_id=spec.hostId)
    labels = {**template.labels, **_platform_labels(spec, control_plane=control_plane)}
    env: list[dict[str, Any]] = [
        {"name": env_name, "valueFrom": {"fieldRef": {"fieldPath": path}}} for env_name, path in DOWNWARD_ENV
    ]
    env += [
        {"name": "KRT_GRPC_PORT", "value": str(GRPC_PORT)},
        {"name": "KRT_INVOKE_PORT", "value": str(INVOKE_PORT)},
        {"name": "KRT_HEALTH_PORT", "value": str(HEALTH_PORT)},
        *template.env,
    ]
    args = [
        "--host-id",
        spec.hostId,
        "--runtime",
        spec.runtime,
        "--host-uid",
        "$(KRT_POD_UID)",
        # The pod's own IP: the address the host advertises to gateways is where it listens.
        "--listen",
        "$(KRT_POD_IP):$(KRT_GRPC_PORT)",
        "--invoke-listen",
        "$(KRT_POD_IP):$(KRT_INVOKE_PORT)",
        "--health-listen",
        "$(KRT_POD_IP):$(KRT_HEALTH_PORT)",
        "--peer-tls",
        CERT_MOUNT,
        "--assignment-public-key",
        f"{CERT_MOUNT}/{ASSIGNMENT_PUBLIC_KEY}",
        "--state-dir",
        STATE_DIR,
        "--role-bindings",
        ROLE_BINDINGS_FILE,
        "--uid-lock-dir",
        UID_LOCK_DIR,
        # the pod's own uids (empty without the annotation: the host's default range)
        "--uid-range",
        USERNS_UID_RANGE if template.hostUsers is False else "$(KRT_UID_RANGE)",
        "--heartbeat-interval",
        f"{spec.heartbeatIntervalSeconds:g}",
    ]
    args += host_flags(spec.sandbox)
    for gateway in spec.gateways:
        args += ["--gateway", gateway]
    secret = certificate_secret(spec, settings, control_plane=control_plane)
    volumes: list[dict[str, Any]] = [
        {"name": STATE_VOLUME, "emptyDir": {}},
        {"name": CERT_VOLUME, "secret": {"secretName": secret, "defaultMode": 0o400}},
        *template.volumes,
    ]
    mounts: list[dict[str, Any]] = [
        {"name": STATE_VOLUME, "mountPath": STATE_MOUNT},
        {"name": CERT_VOLUME, "mountPath": CERT_MOUNT, "readOnly": True},
        *template.volumeMounts,
    ]
    injection = settings.hostInjection
    init_containers: list[dict[str, Any]] = []
    command = ["krt", "host"]
    if injection is not None:
        # After the template's entries, so a schema error still names the template's index.
        volumes.append({"name": HOST_VOLUME, "emptyDir": {}})
        mounts.append({"name": HOST_VOLUME, "mountPath": HOST_MOUNT, "readOnly": True})
        install: dict[str, Any] = {
            "name": INSTALL_CONTAINER,
            "image": injection.image,
            "command": ["krt", "install-host", HOST_MOUNT],
            "volumeMounts": [{"name": HOST_VOLUME, "mountPath": HOST_MOUNT}],
            "terminationMessagePolicy": "FallbackToLogsOnError",
            **_given(
                imagePullPolicy=injection.imagePullPolicy,
                securityContext=template.containerSecurityContext,
                resources=template.resources,
            ),
        }
        init_containers.append(install)
        command = [f"{HOST_MOUNT}/bin/krt", "host"]
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": template.image,
        "command": command,
        "args": args,
        "env": env,
        "ports": [
            {"name": GRPC_PORT_NAME, "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": INVOKE_PORT_NAME, "containerPort": INVOKE_PORT, "protocol": "TCP"},
            {"name": HEALTH_PORT_NAME, "containerPort": HEALTH_PORT, "protocol": "TCP"},
        ],
        # Ready once the Runtime Server's health service says SERVING (on its plaintext port).
        "readinessProbe": {"grpc": {"port": HEALTH_PORT}, "periodSeconds": 2, "failureThreshold": 2},
        # Ended once its health port has not answered for a minute (the pod then fails, as it never
        # restarts, and its pool replaces the host); not before its start timeout, which rules the
        # start itself.
        "livenessProbe": {
            "grpc": {"port": HEALTH_PORT},
            "initialDelaySeconds": math.ceil(settings.startTimeoutSeconds),
            "periodSeconds": LIVENESS_PERIOD_S,
            "timeoutSeconds": LIVENESS_TIMEOUT_S,
            "failureThreshold": LIVENESS_FAILURES,
        },
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        **_given(
            imagePullPolicy=template.imagePullPolicy,
            resources=template.resources,
            securityContext=template.containerSecurityContext,
        ),
    }
    pod_spec: dict[str, Any] = {
        **({"initContainers": init_containers} if init_containers else {}),
        "containers": [container],
        "restartPolicy": "Never",
        "automountServiceAccountToken": template.automountServiceAccountToken,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": settings.deleteGraceSeconds,
        "volumes": volumes,
        **_given(
            nodeSelector=template.nodeSelector or None,
            tolerations=template.tolerations or None,
            affinity=template.affinity,
            serviceAccountName=template.serviceAccountName,
            hostUsers=template.hostUsers,
            securityContext=template.securityContext,
            priorityClassName=template.priorityClassName,
            imagePullSecrets=[{"name": n} for n in template.imagePullSecrets] or None,
        ),
    }
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": labels,
            "annotations": {**template.annotations, ANNOTATION_CONTROL_PLANE: control_plane},
        },
        "spec": pod_spec,
    }
    pod["metadata"]["annotations"][ANNOTATION_TEMPLATE_HASH] = template_hash(pod)
    return pod


def _given(**fields: Any) -> dict[str, Any]:
    """The fields that are set: a template's unset (None) field is left out of the pod, so
    Kubernetes applies its own default."""
    return {key: value for key, value in fields.items() if value is not None}


def template_hash(pod: dict[str, Any]) -> str:
    """16 hex of the hash of everything the platform decided about the pod but the hash itself."""
    metadata = dict(pod.get("metadata") or {})
    annotations = {
        k: v
        for k, v in (metadata.get("annotations") or {}).items()
        if k not in (ANNOTATION_TEMPLATE_HASH, ANNOTATION_UID_RANGE)
    }
    subject = {
        "labels": metadata.get("labels") or {},
        "annotations": annotations,
        "spec": pod.get("spec") or {},
    }
    canonical = json.dumps(subject, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


# --- checking a built pod against the Kubernetes schema -------------------------------------------

# Where the template's fields land in the pod, so a schema error names the template's field.
_CONTAINER_FIELDS = {
    "image": "image",
    "imagePullPolicy": "imagePullPolicy",
    "resources": "resources",
    "securityContext": "containerSecurityContext",
    "env": "env",
    "volumeMounts": "volumeMounts",
}
_POD_FIELDS = {
    "nodeSelector",
    "tolerations",
    "affinity",
    "serviceAccountName",
    "hostUsers",
    "securityContext",
    "priorityClassName",
    "volumes",
    "imagePullSecrets",
}


# How many entries of these lists the platform puts before the template's (see build_pod).
_PLATFORM_ENTRIES = {"env": len(DOWNWARD_ENV) + 3, "volumes": 2, "volumeMounts": 2}


def _template_path(path: list[str | int]) -> str:
    def join(parts: list[str | int]) -> str:
        return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)

    def field(name: str, template_name: str, rest: list[str | int]) -> str | None:
        skip = _PLATFORM_ENTRIES.get(name, 0)
        if skip and rest and isinstance(rest[0], int):
            if rest[0] < skip:
                return None  # one of the platform's own entries
            rest = [rest[0] - skip, *rest[1:]]
        return f"podTemplate.{template_name}{join(rest)}"

    found: str | None = None
    if path[:3] == ["spec", "containers", 0] and len(path) > 3 and path[3] in _CONTAINER_FIELDS:
        found = field(str(path[3]), _CONTAINER_FIELDS[str(path[3])], path[4:])
    elif path[:1] == ["spec"] and len(path) > 1 and path[1] in _POD_FIELDS:
        found = field(str(path[1]), str(path[1]), path[2:])
    if found is not None:
        return found
    if path[:1] == ["metadata"] and len(path) > 1 and path[1] in ("labels", "annotations"):
        return f"podTemplate.{path[1]}{join(path[2:])}"
    return f"pod{join(path)}"


def schema_problems(pod: dict[str, Any]) -> list[str]:
    """What the Kubernetes schema (strict: no unknown fields) finds wrong with ``pod``: one
    ``"<template field>: <what>"`` per problem, the field named as the template spells it."""
    try:
        kubernetes_validate.validate(pod, SCHEMA_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{_template_path(list(e.absolute_path))}: {e.message}"]
    return []


# --- what a pod says -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodFacts:
    """The parts of a pod the provider and the watch decide on."""

    name: str
    namespace: str
    uid: str
    labels: dict[str, str]
    annotations: dict[str, str]
    phase: str
    deleting: bool
    ready: bool
    pod_ip: str
    grpc_port: int | None
    reason: str  # status.reason, e.g. Evicted
    message: str

    @classmethod
    def of(cls, pod: dict[str, Any]) -> PodFacts:
        metadata = _mapping(pod.get("metadata"))
        status = _mapping(pod.get("status"))
        conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        return cls(
            name=str(metadata.get("name") or ""),
            namespace=str(metadata.get("namespace") or ""),
            uid=str(metadata.get("uid") or ""),
            labels={str(k): str(v) for k, v in _mapping(metadata.get("labels")).items()},
            annotations={str(k): str(v) for k, v in _mapping(metadata.get("annotations")).items()},
            phase=str(status.get("phase") or "Pending"),
            deleting=bool(metadata.get("deletionTimestamp")),
            ready=ready,
            pod_ip=str(status.get("podIP") or ""),
            grpc_port=_port(pod, GRPC_PORT_NAME),
            reason=str(status.get("reason") or ""),
            message=str(status.get("message") or ""),
        )

    @property
    def runtime(self) -> str:
        return self.labels.get(LABEL_RUNTIME, "")

    @property
    def host_id(self) -> str:
        return self.labels.get(LABEL_HOST_ID, "")

    @property
    def finished(self) -> bool:
        """Its containers ended and will not restart (restartPolicy Never)."""
        return self.phase in ("Failed", "Succeeded")

    @property
    def evicted(self) -> bool:
        return self.phase == "Failed" and self.reason == "Evicted"

    def address(self) -> str | None:
        """host:port of its Runtime Server: the pod IP and the container's grpc port."""
        if not self.pod_ip or self.grpc_port is None:
            return None
        return (
            f"[{self.pod_ip}]:{self.grpc_port}" if ":" in self.pod_ip else f"{self.pod_ip}:{self.grpc_port}"
        )

    def owned_by(self, control_plane: str) -> bool:
        """Labelled as a kruntimes host and annotated with this control plane."""
        return (
            self.labels.get(LABEL_NAME) == APP_NAME
            and self.labels.get(LABEL_MANAGED_BY) == MANAGED_BY
            and self.annotations.get(ANNOTATION_CONTROL_PLANE) == control_plane
        )


@dataclass(frozen=True)
class Verdict:
    """What a pod's status says about starting its host: ready, still starting, or failed."""

    state: str  # "ready" | "starting" | "failed"
    reason: FailureReason | None = None
    message: str = ""

    @property
    def failed(self) -> bool:
        return self.state == "failed"


def assess(pod: dict[str, Any]) -> Verdict:
    """Decide on a host pod that is being started. A failure is final for this pod; "starting"
    carries the reason to report if the start timeout runs out now (e.g. Unschedulable)."""
    facts = PodFacts.of(pod)
    if facts.deleting:
        return Verdict("failed", FailureReason.HostLost, "the pod is being deleted")
    if facts.evicted:
        return Verdict("failed", FailureReason.HostLost, f"the pod was evicted: {facts.message}".rstrip(": "))
    container = _container_status(pod)
    state = _mapping(container.get("state"))
    waiting, terminated = _mapping(state.get("waiting")), _mapping(state.get("terminated"))
    if terminated:
        return Verdict("failed", FailureReason.HostCrashed, f"the host exited: {_terminated(terminated)}")
    if facts.finished:
        text = f"the pod is {facts.phase}" + (
            f": {facts.reason} {facts.message}".rstrip() if facts.reason else ""
        )
        return Verdict("failed", FailureReason.HostCrashed, text)
    reason = str(waiting.get("reason") or "")
    detail = str(waiting.get("message") or "")
    if reason in _IMAGE_FAILURES:
        return Verdict("failed", FailureReason.ImagePullFailed, f"{reason}: {detail}".rstrip(": "))
    if reason == "CrashLoopBackOff":
        last = _mapping(_mapping(container.get("lastState")).get("terminated"))
        return Verdict(
            "failed", FailureReason.HostCrashed, f"CrashLoopBackOff; last exit: {_terminated(last)}"
        )
    if facts.phase == "Running" and facts.ready:
        return Verdict("ready")
    scheduled = _condition(pod, "PodScheduled")
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return Verdict(
            "starting", FailureReason.Unschedulable, str(scheduled.get("message") or "unschedulable")
        )
    if reason and reason not in _STARTING:
        # ErrImagePull before its backoff, CreateContainerConfigError ...: may still resolve.
        return Verdict(
            "starting", FailureReason.ReadinessTimeout, f"waiting: {reason}: {detail}".rstrip(": ")
        )
    what = f"phase {facts.phase}" + (", not Ready" if facts.phase == "Running" else "")
    if reason:
        what += f", {reason}"
    return Verdict("starting", FailureReason.ReadinessTimeout, what)


def _terminated(state: dict[str, Any]) -> str:
    if not state:
        return "no last state reported"
    parts = [f"exit code {state.get('exitCode')}"]
    if state.get("signal"):
        parts.append(f"signal {state.get('signal')}")
    if state.get("reason"):
        parts.append(str(state["reason"]))
    if state.get("message"):
        parts.append(str(state["message"])[-512:].strip())
    return ", ".join(parts)


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _container_status(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = _mapping(pod.get("status")).get("containerStatuses") or []
    return next((s for s in statuses if isinstance(s, dict) and s.get("name") == CONTAINER), {})


def _condition(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    conditions = _mapping(pod.get("status")).get("conditions") or []
    return next((c for c in conditions if isinstance(c, dict) and c.get("type") == kind), {})


def _port(pod: dict[str, Any], name: str) -> int | None:
    containers = _mapping(pod.get("spec")).get("containers") or []
    for container in containers:
        if isinstance(container, dict) and container.get("name") == CONTAINER:
            for port in container.get("ports") or []:
                if isinstance(port, dict) and port.get("name") == name:
                    value = port.get("containerPort")
                    return value if isinstance(value, int) and 1 <= value <= 65535 else None
    return None
