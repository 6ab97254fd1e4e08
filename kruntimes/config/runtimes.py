"""Platform configuration: runtimes, tenants and pool limits, read once from YAML at an entry point.

    runtimes:
      - name: python
        adapter: python
        runs: 10          # run slots per host
        minHosts: 0       # warm hosts kept
        maxHosts: 4
        provider: process
        scaleInDelaySeconds: 300      # a host beyond minHosts idle this long is drained and deleted
        assignmentTimeoutSeconds: 60  # a host not Ready after twice this is deleted and replaced
        oneshot: false                # true: every Run gets a fresh host, deleted when it ends
        isolation: uid    # or same-user; unset: the platform's default
        network: outbound # the default: not the machine's addresses, link-local or private
                          # ranges; host: an opt-out; none: only loopback; or a mapping:
        # network: {egress: {allow: ["10.1.2.3/32:5432", "[fd00::/8]:443", "192.0.2.0/24:*"]}}
        limits: {processes: 256, memoryBytes: 1073741824, fileSizeBytes: 268435456}
    allowedSourceRoots: [/srv/functions]   # where source.path may point
    sharedDirectories: [/srv/data]         # what every function sees besides its workspace
    tenants:
      - name: tenant-a
        mode: Dedicated
        maxHosts: 3         # hosts of its own, per runtime
        maxRunsPerHost: 5   # its Runs on one host at once
        queueLimit: 500     # its Runs waiting in one runtime's queue
        queueShare: 0.5     # the part of a runtime's queue it may fill; its weight when placed
    queueLimit: 1000
    heartbeatIntervalSeconds: 5
    reconcileIntervalSeconds: 60  # the orphan collection of every runtime

A runtime whose hosts are pods (``provider: kubernetes``) says where and how in ``kubernetes``::

      - name: python
        adapter: python
        provider: kubernetes
        kubernetes:
          namespace: kruntimes-hosts    # where the host pods live
          startTimeoutSeconds: 60       # create → Ready and serving, or the create fails
          deleteGraceSeconds: 30        # SIGTERM → SIGKILL when a host pod is deleted
          certificateSecret: null       # e.g. "krt-host-{runtime}-{hostId}": mounted, passed to krt host
          podTemplate:                  # what the platform does not decide about the pod
            image: registry.example/kruntimes:1.0   # has `krt` on its PATH
            imagePullPolicy: IfNotPresent
            imagePullSecrets: [regcred]
            resources: {requests: {cpu: 500m, memory: 512Mi}, limits: {memory: 1Gi}}
            nodeSelector: {kubernetes.io/os: linux}
            tolerations: [...]
            affinity: {...}
            serviceAccountName: kruntimes-host
            automountServiceAccountToken: false   # the default; true only if the host needs the API
            hostUsers: false                      # a user namespace of the pod's own
            securityContext: {runAsNonRoot: true}       # the pod's
            containerSecurityContext: {allowPrivilegeEscalation: false}
            priorityClassName: null
            labels: {team: platform}              # never the platform's own keys
            annotations: {}
            env: [{name: LOG_FORMAT, value: json}]
            volumes: []
            volumeMounts: []

The template's Kubernetes objects (resources, tolerations, affinity, security contexts, env,
volumes, mounts) are checked against the Kubernetes schema when the worker starts, in the pod the
platform builds from them: a bad field is an error naming it before any pod is created.

Anything left out takes its default; no file at all gives the ``python`` and ``bash`` runtimes.

Errors::

    ValueError
     └── ConfigError   the file could not be read or validated; .problems by field path
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Any, Literal, Self, get_args

import yaml
from pydantic import AfterValidator, Field, ValidationError, field_validator, model_validator

from kruntimes.api._base import ApiModel, StrictBool, StrictFloat, StrictInt, validate_document
from kruntimes.api.adapters import BASH, PYTHON, AdapterName
from kruntimes.api.ids import RuntimeName
from kruntimes.api.limits import (
    DAY_SECONDS,
    DEFAULT_INVOKE_TIMEOUT_SECONDS,
    MAX_INVOKE_TIMEOUT_SECONDS,
)
from kruntimes.api.names import validate_dns1123_label
from kruntimes.config.egress import MAX_ALLOW, OPT_OUT, UNENFORCED, UNENFORCED_SAME_USER, parse_allow
from kruntimes.decisions.scheduling.failures import ProviderName
from kruntimes.decisions.scheduling.model import SHARED_POLICY, TenancyMode, TenantPolicy

DEFAULT_RUNS = 10
KUBERNETES_PROVIDER = "kubernetes"
DEFAULT_MAX_HOSTS = 4
DEFAULT_QUEUE_LIMIT = 1000
# Bounds that keep durable timers and queue state sane.
MAX_QUEUE_LIMIT = 100_000
MAX_HOSTS_LIMIT = 10_000
MAX_RUNS_PER_HOST = 10_000


def _label(field: str) -> AfterValidator:
    return AfterValidator(lambda value: validate_dns1123_label(value, field=field))


class PlatformConfigError(ValueError):
    """The configuration could not be used. ``problems`` holds one ``"<field path>: <what>"`` each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid kruntimes configuration:\n" + "\n".join(f"  {p}" for p in problems))
        self.problems = tuple(problems)


MiB = 1024 * 1024


class ResourceLimits(ApiModel):
    """What one function may use, whatever the host's own uid: hitting a limit is a result of
    that invocation (the process is stopped or refused), never a host crash."""

    openFiles: StrictInt = Field(default=1024, ge=16, le=1 << 20)  # per process
    # processes and threads of the whole function (its cgroup, and its uid's process limit)
    processes: StrictInt = Field(default=256, ge=4, le=1 << 16)
    # memory across all of the function's processes (a cgroup where the host can make one)
    memoryBytes: StrictInt | None = Field(default=1024 * MiB, ge=16 * MiB)
    addressSpaceBytes: StrictInt = Field(default=4096 * MiB, ge=64 * MiB)  # per process
    cpuSeconds: StrictInt = Field(default=3600, ge=1)  # per process
    fileSizeBytes: StrictInt = Field(default=256 * MiB, ge=0)  # largest file it may write
    tmpBytes: StrictInt = Field(default=64 * MiB, ge=MiB)  # its private /tmp and /dev/shm


# Keys and prefixes of labels and annotations the platform sets on host pods itself.
PLATFORM_LABEL_PREFIXES = ("kruntimes.io/", "app.kubernetes.io/")
# The create of a host runs in an activity bounded by ScaleOutWorkflow's CREATE_TIMEOUT: the start
# timeout stays below it, to leave time to delete a pod that did not start.
MAX_START_TIMEOUT_SECONDS = 80.0
MAX_DELETE_GRACE_SECONDS = 3600
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)")
_SECRET_FIELDS = frozenset({"runtime", "hostId"})


def _subdomain(value: str, *, field: str) -> str:
    if not 1 <= len(value) <= 253 or not _DNS1123_SUBDOMAIN.fullmatch(value):
        raise ValueError(
            f"{field}: must be a DNS-1123 subdomain (lowercase, digits, '-', '.'): {value!r:.80}"
        )
    return value


def _label_key(key: str) -> str:
    """A Kubernetes label or annotation key: [prefix/]name, the prefix a DNS subdomain."""
    prefix, _, name = key.rpartition("/")
    if prefix:
        _subdomain(prefix, field=f"key {key!r:.80}")
    if not 1 <= len(name) <= 63 or not _QUALIFIED_NAME.fullmatch(name):
        raise ValueError(f"key {key!r:.80}: the name part must be 1..63 of [A-Za-z0-9-_.]")
    return key


def _label_value(key: str, text: str) -> None:
    if len(text) > 63 or not _LABEL_VALUE.fullmatch(text):
        raise ValueError(f"{key}: a label value is at most 63 of [A-Za-z0-9-_.]: {text!r:.80}")


def _own_keys(keys: dict[str, str], *, field: str) -> None:
    for key in keys:
        _label_key(key)
        if key.startswith(PLATFORM_LABEL_PREFIXES):
            raise ValueError(f"{field}: {key!r:.80} is set by the platform itself")


class KubernetesPodTemplate(ApiModel):
    """What the platform leaves to the operator about a host pod. The Kubernetes objects here are
    passed through as they are and checked against the Kubernetes schema in the pod built from
    them (when the worker starts); everything else about the pod is the platform's."""

    image: Annotated[str, Field(min_length=1, max_length=1024)]
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] | None = None
    imagePullSecrets: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(
        default_factory=list, max_length=16
    )
    resources: dict[str, Any] | None = None
    nodeSelector: dict[str, str] = Field(default_factory=dict, max_length=64)
    tolerations: list[dict[str, Any]] = Field(default_factory=list, max_length=64)
    affinity: dict[str, Any] | None = None
    serviceAccountName: str | None = None
    # The host never calls the Kubernetes API: no token unless the template asks for one.
    automountServiceAccountToken: StrictBool = False
    # false: the pod gets a user namespace of its own (its root is no node root), where its host
    # may make PID and mount namespaces for functions; its functions' uids are then the pod's own
    hostUsers: StrictBool | None = None
    securityContext: dict[str, Any] | None = None  # the pod's
    containerSecurityContext: dict[str, Any] | None = None  # the host container's
    priorityClassName: str | None = None
    labels: dict[str, str] = Field(default_factory=dict, max_length=64)
    annotations: dict[str, str] = Field(default_factory=dict, max_length=64)
    env: list[dict[str, Any]] = Field(default_factory=list, max_length=256)
    volumes: list[dict[str, Any]] = Field(default_factory=list, max_length=64)
    volumeMounts: list[dict[str, Any]] = Field(default_factory=list, max_length=64)

    @field_validator("serviceAccountName", "priorityClassName")
    @classmethod
    def _names(cls, value: str | None) -> str | None:
        return None if value is None else _subdomain(value, field="name")

    @field_validator("imagePullSecrets")
    @classmethod
    def _secret_names(cls, value: list[str]) -> list[str]:
        return [_subdomain(name, field="imagePullSecrets") for name in value]

    @field_validator("nodeSelector")
    @classmethod
    def _selector(cls, value: dict[str, str]) -> dict[str, str]:
        for key, text in value.items():
            _label_value(_label_key(key), text)
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        _own_keys(value, field="labels")
        for key, text in value.items():
            _label_value(key, text)
        return value

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, value: dict[str, str]) -> dict[str, str]:
        _own_keys(value, field="annotations")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for item in value:
            name = item.get("name")
            if not isinstance(name, str) or not name:
                raise ValueError("env: every entry needs a name")
            if name.startswith("KRT_"):
                raise ValueError(f"env: {name!r:.80} is set by the platform (KRT_ is its prefix)")
        return value


class HostInjection(ApiModel):
    """Hosts on pods of an image without kruntimes in it (a KRM function's own image, so the
    function finds its files where it expects them): an init container of the kruntimes image
    (`image`) installs the host into an emptyDir (`krt install-host`), and the host container,
    of the template's image, runs it from there."""

    image: Annotated[str, Field(min_length=1, max_length=1024)]
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] | None = None


class KubernetesRuntime(ApiModel):
    """Where and how the hosts of a ``provider: kubernetes`` runtime run as pods."""

    namespace: Annotated[str, _label("namespace")]
    podTemplate: KubernetesPodTemplate
    startTimeoutSeconds: StrictFloat = Field(
        default=60.0, gt=0, le=MAX_START_TIMEOUT_SECONDS, allow_inf_nan=False
    )
    deleteGraceSeconds: StrictInt = Field(default=30, ge=0, le=MAX_DELETE_GRACE_SECONDS)
    # The Secret holding each host's certificate (tls.crt, tls.key, ca.crt), by a name with
    # {runtime} and {hostId} in it (one identity per host); None: hosts get no certificate.
    certificateSecret: str | None = None
    # None: the template's image has kruntimes in it and runs `krt host` itself.
    hostInjection: HostInjection | None = None

    @field_validator("certificateSecret")
    @classmethod
    def _secret(cls, value: str | None) -> str | None:
        if value is None:
            return None
        fields = set(re.findall(r"\{([^{}]*)\}", value))
        if fields - _SECRET_FIELDS:
            raise ValueError(
                f"only {{runtime}} and {{hostId}} may be filled in, not {sorted(fields - _SECRET_FIELDS)}"
            )
        sample = value.replace("{runtime}", "r").replace("{hostId}", "h")
        _subdomain(sample, field="certificateSecret")
        return value

    def certificate_secret(self, *, runtime: str, host_id: str) -> str | None:
        if self.certificateSecret is None:
            return None
        name = self.certificateSecret.replace("{runtime}", runtime).replace("{hostId}", host_id)
        return _subdomain(name, field="certificateSecret")


NetworkMode = Literal["outbound", "host", "none"]
OUTBOUND: NetworkMode = "outbound"


class EgressConfig(ApiModel):
    """Destinations a runtime's functions reach although `network: outbound` refuses them."""

    allow: list[str] = Field(default_factory=list, max_length=MAX_ALLOW)

    @field_validator("allow")
    @classmethod
    def _valid_entries(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            parse_allow(entry)  # ValueError naming the entry and what is wrong with it
        return entries


class NetworkConfig(ApiModel):
    """`network: {egress: {allow: [...]}}`: outbound, with an allow list."""

    egress: EgressConfig


class RuntimeConfig(ApiModel):
    """One runtime: its language adapter and the pool of hosts that serve it."""

    name: Annotated[RuntimeName, _label("name")]
    adapter: AdapterName
    runs: StrictInt = Field(default=DEFAULT_RUNS, ge=1, le=MAX_RUNS_PER_HOST)
    minHosts: StrictInt = Field(default=0, ge=0, le=MAX_HOSTS_LIMIT)
    maxHosts: StrictInt = Field(default=DEFAULT_MAX_HOSTS, ge=1, le=MAX_HOSTS_LIMIT)
    provider: ProviderName = "process"
    # Idle time before a host beyond minHosts is drained and deleted.
    scaleInDelaySeconds: StrictFloat = Field(default=300.0, ge=0, le=DAY_SECONDS, allow_inf_nan=False)
    # How long a host may stay Assigned; it is deleted after twice this.
    assignmentTimeoutSeconds: StrictFloat = Field(default=60.0, gt=0, le=DAY_SECONDS, allow_inf_nan=False)
    # Invocation timeout when the caller names none.
    invokeTimeoutSeconds: StrictFloat = Field(
        default=float(DEFAULT_INVOKE_TIMEOUT_SECONDS),
        gt=0,
        le=MAX_INVOKE_TIMEOUT_SECONDS,
        allow_inf_nan=False,
    )
    limits: ResourceLimits | None = None  # None: every default of ResourceLimits
    # uid: each function its own unprivileged uid (hosts refuse to start where they cannot);
    # same-user: functions run as the host's user. None: the platform's default (`krt worker
    # --isolation`, uid unless told otherwise).
    isolation: Literal["uid", "same-user"] | None = None
    # outbound: functions reach the outside world, not the machine's own addresses (loopback
    # included), link-local or private ranges (packet rules keyed to their uids; docs/security.md);
    # host: no such rules, an explicit opt-out; none: a network namespace with only loopback; a
    # mapping ({egress: {allow: [CIDR:PORT, ...]}}): outbound with those destinations allowed
    network: NetworkMode | NetworkConfig = OUTBOUND
    # The pods of a `provider: kubernetes` runtime; required by it, refused with another provider.
    kubernetes: KubernetesRuntime | None = None
    # Each Run gets a fresh host of its own, deleted when the Run ends (its `runs` is taken as 1).
    oneshot: StrictBool = False

    @field_validator("network", mode="before")
    @classmethod
    def _one_network(cls, value: Any) -> Any:
        """A name or a mapping, each said wrong alone (the union would report both readings)."""
        if isinstance(value, dict):
            try:
                return NetworkConfig.model_validate(value)
            except ValidationError as e:
                problems = [
                    f"{'.'.join(str(p) for p in item['loc'])}: {item['msg'].removeprefix('Value error, ')}"
                    for item in e.errors(include_url=False)
                ]
                raise ValueError("; ".join(problems)) from None
        if value not in get_args(NetworkMode) and not isinstance(value, NetworkConfig):
            raise ValueError(
                f"one of {', '.join(get_args(NetworkMode))}, or {{egress: {{allow: [CIDR:PORT, ...]}}}}; "
                f"not {str(value)[:40]!r}"
            )
        return value

    @property
    def network_mode(self) -> NetworkMode:
        return OUTBOUND if isinstance(self.network, NetworkConfig) else self.network

    @property
    def egress_allow(self) -> list[str]:
        return list(self.network.egress.allow) if isinstance(self.network, NetworkConfig) else []

    @model_validator(mode="after")
    def _max_covers_min(self) -> Self:
        if self.maxHosts < self.minHosts:
            raise ValueError(f"maxHosts: must be >= minHosts ({self.minHosts}), got {self.maxHosts}")
        return self

    @model_validator(mode="after")
    def _kubernetes_block(self) -> Self:
        if self.provider == KUBERNETES_PROVIDER and self.kubernetes is None:
            raise ValueError(
                "kubernetes: provider kubernetes needs a kubernetes block (namespace, podTemplate)"
            )
        if self.provider != KUBERNETES_PROVIDER and self.kubernetes is not None:
            raise ValueError(f"kubernetes: only for provider kubernetes, not {self.provider}")
        return self


class TenantConfig(ApiModel):
    """One tenant and its isolation settings (the fields of TenantPolicy, plus its name)."""

    name: Annotated[str, _label("name")]
    mode: TenancyMode = TenancyMode.Shared
    allowSharedFallback: StrictBool = False
    preferDedicatedCapacity: StrictBool = True
    group: Annotated[str, _label("group")] | None = None
    maxHosts: StrictInt | None = Field(default=None, ge=0, le=MAX_HOSTS_LIMIT)
    # Its Runs on one host at once, whoever owns the host (Shared hosts included).
    maxRunsPerHost: StrictInt | None = Field(default=None, ge=1, le=MAX_RUNS_PER_HOST)
    # Its Runs waiting in one runtime's queue; beyond it, its next Run is rejected (QueueFull).
    queueLimit: StrictInt | None = Field(default=None, ge=0, le=MAX_QUEUE_LIMIT)
    # The part of each runtime's queue it may fill (0 < share <= 1), and its weight when queued
    # Runs are placed: freed slots go round the tenants with Runs waiting, in proportion to it.
    queueShare: StrictFloat | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)

    @model_validator(mode="after")
    def _valid_policy(self) -> Self:
        try:
            self.policy()
        except ValidationError as e:
            problems = [item["msg"].removeprefix("Value error, ") for item in e.errors(include_url=False)]
            raise ValueError("; ".join(problems)) from e
        return self

    def policy(self) -> TenantPolicy:
        return TenantPolicy.model_validate(self.model_dump(exclude={"name"}))


class ProviderCircuitConfig(ApiModel):
    """`providerCircuit`: the breaker of each (provider, runtime) a worker creates hosts with
    (kruntimes.activities.hosts.circuit): it opens after `failures` creates failed in a row, and
    lets one trial create through `openSeconds` later; while open, a create fails at once with
    CircuitOpen instead of calling the provider."""

    failures: StrictInt = Field(default=5, ge=1, le=1000)
    openSeconds: StrictFloat = Field(default=30.0, gt=0, le=DAY_SECONDS, allow_inf_nan=False)


def _default_runtimes() -> list[RuntimeConfig]:
    return [RuntimeConfig(name=adapter.name, adapter=adapter.name) for adapter in (PYTHON, BASH)]


def _unique_names(items: list[RuntimeConfig] | list[TenantConfig], *, what: str) -> None:
    seen: set[str] = set()
    for item in items:
        if item.name in seen:
            raise ValueError(f"{what} names must be unique; {item.name!r} appears more than once")
        seen.add(item.name)


class PlatformConfig(ApiModel):
    runtimes: list[RuntimeConfig] = Field(default_factory=_default_runtimes, min_length=1)
    # Directories a Run's `source.path` may name (it and what lies below it). None: the worker's
    # default (`krt up`: the directory it was started from and the user's home); [] allows none,
    # only inline sources. A state directory is refused wherever it lies.
    allowedSourceRoots: list[str] | None = Field(default=None, max_length=64)
    # Directories every function sees with their real content (data handed to functions, e.g. a
    # dataset); nothing else outside its workspace is shared. Absolute paths; a state directory
    # is hidden wherever it lies.
    sharedDirectories: list[str] = Field(default_factory=list, max_length=64)
    tenants: list[TenantConfig] = Field(default_factory=list)
    # Runs waiting for capacity, per runtime pool; beyond it admission rejects with QueueFull.
    queueLimit: StrictInt = Field(default=DEFAULT_QUEUE_LIMIT, ge=0, le=MAX_QUEUE_LIMIT)
    heartbeatIntervalSeconds: StrictFloat = Field(default=5.0, gt=0, le=3600.0, allow_inf_nan=False)
    # How often each runtime's reconciler looks for orphans (and at every worker start), at least:
    # a round that took long waits longer (kruntimes.decisions.reconciling.next_round_in); None: only at
    # worker start and when an operator asks (`krt hosts reconcile`).
    reconcileIntervalSeconds: StrictFloat | None = Field(
        default=60.0, ge=1.0, le=DAY_SECONDS, allow_inf_nan=False
    )
    # The worker's breaker of each host provider and runtime (ProviderCircuitConfig).
    providerCircuit: ProviderCircuitConfig = Field(default_factory=lambda: ProviderCircuitConfig())

    @field_validator("runtimes")
    @classmethod
    def _unique_runtimes(cls, runtimes: list[RuntimeConfig]) -> list[RuntimeConfig]:
        _unique_names(runtimes, what="runtime")
        return runtimes

    @field_validator("allowedSourceRoots", "sharedDirectories")
    @classmethod
    def _absolute_directories(cls, paths: list[str] | None) -> list[str] | None:
        for path in paths or []:
            if not path.startswith("/") or "\x00" in path or len(path) > 4096:
                raise ValueError(f"not an absolute path: {path[:80]!r}")
            if any(part in (".", "..") for part in path.split("/")):
                raise ValueError(f"a directory without . or .. parts, not {path[:80]!r}")
        return paths

    @field_validator("tenants")
    @classmethod
    def _unique_tenants(cls, tenants: list[TenantConfig]) -> list[TenantConfig]:
        _unique_names(tenants, what="tenant")
        return tenants

    def runtime(self, name: str) -> RuntimeConfig | None:
        return next((r for r in self.runtimes if r.name == name), None)

    def tenant_policy(self, tenant: str | None) -> TenantPolicy | None:
        """The policy for a Run's tenant: SHARED_POLICY without one, None for an unknown name.

        An unknown tenant is refused (TenantNotAllowed), never guessed to be Shared: a misspelt
        Dedicated tenant must not land on shared capacity.
        """
        if tenant is None:
            return SHARED_POLICY
        return next((t.policy() for t in self.tenants if t.name == tenant), None)


def _field_named(path: str, name: str) -> str | None:
    # A model-level validator named the field: "maxHosts: must be ..." at "runtimes.0".
    if " " in name or not name.isidentifier():
        return None
    return f"{path}.{name}" if path != "<config>" else name


def network_warnings(config: PlatformConfig, *, default_isolation: str, root: bool) -> list[str]:
    """What `krt up` says at start of its runtimes' networks: each `network: host` (the opt-out),
    and each `network: outbound` its hosts cannot enforce (`root`: whether they run as root;
    `default_isolation`: a runtime's isolation when it names none)."""
    said = []
    for runtime in config.runtimes:
        isolation = runtime.isolation or default_isolation
        if runtime.network_mode == "host":
            said.append(f"runtime {runtime.name}: {OPT_OUT}")
        elif runtime.network_mode == OUTBOUND and not root:
            said.append(f"runtime {runtime.name}: {UNENFORCED}")
        elif runtime.network_mode == OUTBOUND and isolation == "same-user":
            said.append(f"runtime {runtime.name}: {UNENFORCED_SAME_USER}")
    return said


def parse_config(data: object) -> PlatformConfig:
    """Validate decoded YAML; ``None`` (an empty file) gives the defaults."""
    if data is None:
        data = {}
    return validate_document(
        PlatformConfig, data, root="<config>", relocate=_field_named, error=PlatformConfigError
    )


def load_config(path: str | os.PathLike[str] | None = None) -> PlatformConfig:
    """Read the platform configuration from a YAML file; None gives the defaults."""
    if path is None:
        return PlatformConfig()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise PlatformConfigError([f"<config>: cannot read {os.fspath(path)!r}: {e}"]) from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PlatformConfigError([f"<config>: not valid YAML: {e}"]) from e
    return parse_config(data)
