"""The Temporal-facing contracts of the control plane: ids, task queues, and every workflow's,
signal's and activity's input and result model. Workflows, activities, the worker, the CLI and
the SDK all import these; nothing here does I/O.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from kruntimes.api._base import ApiModel, StatusMessage
from kruntimes.api.run import Run
from kruntimes.config import RuntimeConfig, TenantConfig
from kruntimes.hosts import HostDefaults, HostSandbox
from kruntimes.scheduling.failures import ProviderFailure
from kruntimes.scheduling.model import AdmissionRequest, Host, Reservation, ScaleOutRequest

TASK_QUEUE = "kruntimes"
# Entity workflows poll their own queue: Runs waiting on them must never hold every task slot.
POOL_TASK_QUEUE = "kruntimes-pool"

# signal, query and update names
SIGNAL_CANCEL = "cancel"
SIGNAL_ASSIGNED = "assigned"
SIGNAL_REJECTED = "rejected"
SIGNAL_HOST_LOST = "host_lost"
QUERY_STATUS = "status"
UPDATE_DELETE = "delete"
SIGNAL_ADMIT = "admit"
SIGNAL_ADMIT_MANY = "admit_many"
SIGNAL_RELEASE = "release"
SIGNAL_HOST_READY = "host_ready"
SIGNAL_SCALE_OUT_FAILED = "scale_out_failed"
SIGNAL_CONFIGURE = "configure"
QUERY_POOL = "pool"

DEFAULT_RETENTION_SECONDS = 24 * 3600  # how long a finished Run stays queryable without a ttl
MAX_ADMISSIONS_PER_SIGNAL = 100  # admissions in one admit_many signal (each is ~0.5 KiB)


def run_workflow_id(namespace: str, name: str) -> str:
    return f"run/{namespace}/{name}"


def pool_workflow_id(runtime: str) -> str:
    return f"pool/{runtime}"


def scale_out_workflow_id(runtime: str, request_id: str) -> str:
    return f"scaleout/{runtime}/{request_id}"


def cleanup_workflow_id(run_uid: str) -> str:
    return f"cleanup/{run_uid}"


def invoke_url(gateway_url: str, *, namespace: str, runtime: str, run_uid: str) -> str:
    base = gateway_url.rstrip("/")
    return f"{base}/v1/namespaces/{namespace}/runtimes/{runtime}/functions/{run_uid}:invoke"


# --- platform ---------------------------------------------------------------------------------


class PlatformInfo(ApiModel):
    """What every Run of the platform is told about where it is invoked."""

    gatewayUrl: str = "https://127.0.0.1:8443"
    caBundle: str | None = None  # PEM, when the gateway's CA is the platform's own
    stateDir: str = ""  # where process hosts keep their records and workspaces
    gatewayHeartbeats: list[str] = Field(default_factory=list)  # heartbeat addresses hosts report to
    heartbeatIntervalSeconds: float = 5.0


# --- RunWorkflow --------------------------------------------------------------------------------


class RunInput(ApiModel):
    run: Run  # metadata.uid is set by whoever starts the workflow (the SDK, the CLI)
    # True when the starter hands the Run's admission to its pool itself, right after the start
    # (kruntimes.starting.start_run): the pool then decides while the Run's first task runs, and
    # the Run asks the pool itself only if no answer came within its admission grace period.
    starterAdmits: bool = False


class Assignment(ApiModel):
    runUid: str
    hostId: str
    hostUid: str
    address: str
    adapter: str
    platform: PlatformInfo


class HostLostSignal(ApiModel):
    hostId: str
    hostUid: str
    reason: StatusMessage = ""


class ProbeInput(ApiModel):
    hosts: list[Host]
    stateDir: str


class ProbeResult(ApiModel):
    lost: list[str] = Field(default_factory=list)  # host uids proven gone


class Rejection(ApiModel):
    runUid: str
    reason: str
    message: StatusMessage = ""


class OutgoingSignal(ApiModel):
    """One answer of the pool to one Run (exactly one payload set)."""

    workflowId: str
    assigned: Assignment | None = None
    rejected: Rejection | None = None
    hostLost: HostLostSignal | None = None


class SignalBatch(ApiModel):
    signals: list[OutgoingSignal]
    runtime: str = ""  # the pool that answers (its Runs may be waiting in the same process)


class AwaitAssignmentInput(ApiModel):
    """A Run waiting, within its first workflow task, for its pool's answer in this process;
    with `run`, the activity also registers attempt 1 on the assigned host."""

    workflowId: str
    runUid: str
    runtime: str
    timeoutSeconds: float
    run: Run | None = None


class SignalResult(ApiModel):
    unreachable: list[str] = Field(default_factory=list)  # workflow ids that are gone


# --- RuntimePoolWorkflow ------------------------------------------------------------------------


class AdmitSignal(ApiModel):
    request: AdmissionRequest
    workflowId: str  # where the answer goes


class AdmitMany(ApiModel):
    """Admissions sent together by one starter (Runs it created at the same time)."""

    admissions: list[AdmitSignal] = Field(max_length=MAX_ADMISSIONS_PER_SIGNAL)


def admit_signal(run: Run, *, workflow_id: str, at: datetime) -> AdmitSignal:
    """A Run's admission request, the same from the Run itself and from its starter."""
    assert run.metadata.uid is not None, "a started Run has a uid"
    return AdmitSignal(
        request=AdmissionRequest(
            runUid=run.metadata.uid,
            namespace=run.metadata.namespace,
            name=run.metadata.name,
            runtime=run.spec.runtime,
            tenant=run.spec.tenant,
            requestedAt=at,
        ),
        workflowId=workflow_id,
    )


RUNTIME_UNKNOWN = "RuntimeUnknown"


def runtime_unknown(run: Run) -> Rejection:
    """The answer for a Run whose runtime has no pool."""
    assert run.metadata.uid is not None, "a started Run has a uid"
    return Rejection(
        runUid=run.metadata.uid,
        reason=RUNTIME_UNKNOWN,
        message=f"no runtime {run.spec.runtime!r} is configured",
    )


class ReleaseSignal(ApiModel):
    runUid: str


class HostReadySignal(ApiModel):
    requestId: str
    host: Host


class ScaleOutFailedSignal(ApiModel):
    requestId: str
    failure: ProviderFailure


class PoolConfig(ApiModel):
    runtime: RuntimeConfig
    tenants: list[TenantConfig] = Field(default_factory=list)
    queueLimit: int = Field(default=1000, ge=0)
    platform: PlatformInfo = Field(default_factory=PlatformInfo)
    providers: list[str] | None = None  # the host providers the workers have; None: not checked
    # How often hosts are checked for death (also on every worker start); None: only then.
    probeIntervalSeconds: float | None = Field(default=60.0, gt=0)
    # The task queue of the Runs' workers, where the pool starts its ScaleOutWorkflows.
    runTaskQueue: str = Field(default=TASK_QUEUE, min_length=1)
    # What the pool's hosts are told about isolation (kruntimes.hosts.host_sandbox).
    hostDefaults: HostDefaults = Field(default_factory=lambda: HostDefaults())


class PoolState(ApiModel):
    hosts: list[Host] = Field(default_factory=list)
    reservations: list[Reservation] = Field(default_factory=list)
    queue: list[AdmitSignal] = Field(default_factory=list)
    scaleOuts: list[ScaleOutRequest] = Field(default_factory=list)
    nextHost: int = 0
    failedScaleOuts: int = 0  # consecutive; reset when a host becomes ready
    owners: dict[str, str] = Field(default_factory=dict)  # run uid → the Run's workflow id


class PoolInput(ApiModel):
    config: PoolConfig
    state: PoolState | None = None  # carried across continue-as-new


# --- ScaleOutWorkflow ---------------------------------------------------------------------------


class ScaleOutInput(ApiModel):
    request: ScaleOutRequest
    hostId: str
    adapter: str
    capacity: int
    stateDir: str
    poolWorkflowId: str
    gateways: list[str] = Field(default_factory=list)
    heartbeatIntervalSeconds: float = 5.0
    sandbox: HostSandbox | None = None  # None (inputs from before isolation): the host's defaults


# --- CleanupWorkflow ----------------------------------------------------------------------------


class CleanupInput(ApiModel):
    runUid: str
    attempt: int
    runtime: str
    address: str | None = None  # the host, when the Run had one
    registrationId: str | None = None
    task: bool = False
    graceSeconds: float = 10.0


class CleanupResult(ApiModel):
    unregistered: bool
    released: bool


# --- activities -------------------------------------------------------------------------------


class RunOnHost(ApiModel):
    """A Run's attempt on one host: what registering a function and executing a task both send."""

    address: str
    runUid: str
    attempt: int
    namespace: str
    name: str
    runtime: str
    adapter: str
    run: Run


class RegisterInput(RunOnHost):
    # the assigned host incarnation, named in the signed assignment the host requires
    hostId: str
    hostUid: str


class RegisterResult(ApiModel):
    registrationId: str
    hostUid: str
    created: bool


class Handoff(ApiModel):
    """What the Run got from its pool in-process: nothing, an assignment, or an assignment and
    the registration of attempt 1 on it (`registerError` when that failed: the Run registers
    again the usual way, where failures count)."""

    assignment: Assignment | None = None
    registration: RegisterResult | None = None
    registerError: str = ""


class StatusInput(ApiModel):
    address: str
    registrationId: str


class FunctionState(ApiModel):
    registered: bool
    ready: bool = False
    fatalError: str = ""
    inFlight: int = 0
    lastActivity: datetime | None = None
    hostUid: str = ""


class UnregisterInput(ApiModel):
    address: str
    registrationId: str
    graceSeconds: float = 10.0


class TaskInput(RunOnHost):
    timeoutSeconds: float


class TaskResult(ApiModel):
    status: str  # Succeeded | Failed | Timeout | Cancelled
    exitCode: int = 0
    outputs: dict[str, object] | None = None
    message: StatusMessage = ""


class CancelTaskInput(ApiModel):
    address: str
    runUid: str
    attempt: int
