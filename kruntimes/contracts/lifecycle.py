"""The Temporal-facing contracts of the control plane: ids, task queues, and every workflow's,
signal's and activity's input and result model. Workflows, activities, the worker, the CLI and
the SDK all import these; nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from kruntimes.api._base import ApiModel, StatusMessage
from kruntimes.api.run import Run
from kruntimes.config.platform import RuntimeConfig, TenantConfig
from kruntimes.contracts.providers import CreatedHost, HostDefaults, HostSandbox
from kruntimes.decisions.scheduling.failures import ProviderFailure
from kruntimes.decisions.scheduling.model import (
    PROVIDER_LABEL,
    AdmissionRequest,
    Host,
    HostState,
    Reservation,
    ScaleOutRequest,
    TenancyMode,
    TenantPolicy,
)

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
SIGNAL_DELETE_NOW = "delete_now"  # RetentionWorkflow: a closed Run's delete
SIGNAL_ADMIT = "admit"
SIGNAL_ADMIT_MANY = "admit_many"
SIGNAL_RELEASE = "release"
SIGNAL_HOST_READY = "host_ready"
SIGNAL_SCALE_OUT_FAILED = "scale_out_failed"
SIGNAL_CONFIGURE = "configure"
SIGNAL_HOST_STATE = "host_state"
QUERY_POOL = "pool"
# what the pool query fails with while a new pool run reads its hosts' reservations back
POOL_READING_BACK = "the pool is reading its hosts' reservations back after continuing as new"
SIGNAL_HOST_SLOTS = "slots"
SIGNAL_REGISTRATION_LOST = "registration_lost"
# HostWorkflow
SIGNAL_HOST_COMMAND = "command"
SIGNAL_PROVIDER_REPORT = "provider_report"
SIGNAL_WATCH_READY = "watch_ready"
QUERY_HOST = "host"
# The slots the pool handed over, read after every signal sent before it (a query may not be).
UPDATE_HOST_SLOTS = "read_slots"
# What the workflow keeps of its host's slots, as `slots_digest`: the pool hands a host over only
# when its HostWorkflow does not hold the same slots already.
QUERY_HOST_SLOTS_DIGEST = "slots_digest"
UPDATE_DRAIN_HOST = "drain"
UPDATE_DELETE_HOST = "delete"
# ReconcileWorkflow
SIGNAL_RECONCILE = "reconcile"
UPDATE_COLLECT = "collect"
QUERY_RECONCILE = "last"

DEFAULT_RETENTION_SECONDS = 24 * 3600  # how long a finished Run stays queryable without a ttl
MAX_ADMISSIONS_PER_SIGNAL = 100  # admissions in one admit_many signal (each is ~0.5 KiB)


def run_workflow_id(namespace: str, name: str) -> str:
    return f"run/{namespace}/{name}"


def run_of_workflow_id(workflow_id: str) -> tuple[str, str]:
    """(namespace, name) of a Run's workflow id; ("default", "run") for any other id."""
    kind, _, rest = workflow_id.partition("/")
    namespace, _, name = rest.partition("/")
    if kind != "run" or not namespace or not name or "/" in name:
        return ("default", "run")
    return (namespace, name)


def pool_workflow_id(runtime: str) -> str:
    return f"pool/{runtime}"


def scale_out_workflow_id(runtime: str, request_id: str) -> str:
    return f"scaleout/{runtime}/{request_id}"


def cleanup_workflow_id(run_uid: str) -> str:
    return f"cleanup/{run_uid}"


def host_workflow_id(runtime: str, host_id: str) -> str:
    return f"host/{runtime}/{host_id}"


def reconcile_workflow_id(runtime: str) -> str:
    return f"reconcile/{runtime}"


def retention_workflow_id(run_uid: str) -> str:
    return f"retention/{run_uid}"


def schedule_id(namespace: str, name: str) -> str:
    """The Temporal Schedule of `krt schedule create NAME -n NAMESPACE`."""
    return f"schedule/{namespace}/{name}"


def scheduled_workflow_id(namespace: str, name: str) -> str:
    """The id a schedule gives its ScheduledRunWorkflows; Temporal appends `-<scheduled time>`."""
    return f"scheduled/{namespace}/{name}"


SCHEDULED_STAMP = "%Y%m%d%H%M%S"  # the Run name's suffix: `<schedule>-20250101120000`
# A Run name is a DNS-1123 label (63 characters): the schedule's name leaves room for the stamp.
MAX_SCHEDULE_NAME = 63 - 1 - len("20250101120000")


def scheduled_run_name(schedule: str, at: datetime) -> str:
    return f"{schedule}-{at.strftime(SCHEDULED_STAMP)}"


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
    # (kruntimes.sdk.starting.start_run): the pool then decides while the Run's first task runs, and
    # the Run asks the pool itself only if no answer came within its admission grace period.
    starterAdmits: bool = False
    # True when the starter reads the status from the history (kruntimes.sdk.starting.start_run):
    # the Run then writes its status to the STATUS_MEMO memo in the task that indexes each new
    # phase, just before the KrtPhase upsert, and `wait` needs no status query. (False for Runs
    # started otherwise, and in every history recorded before it: those Runs never upsert a memo.)
    statusMemo: bool = False


# The memo the Run writes its status (a RunStatus, through the data converter and its codec) to.
STATUS_MEMO = "krtStatus"


class Assignment(ApiModel):
    runUid: str
    hostId: str
    hostUid: str
    address: str
    adapter: str
    platform: PlatformInfo
    provider: str = ""  # the host's provider ("" from pools that did not say)


class HostLostSignal(ApiModel):
    """The pool to a Run: its host is gone, going or draining.

    fenced: the old assignment is proven unable to serve (the host is gone, or deleting and out of
    routing, or acknowledged unregister): the Run may register elsewhere. Not fenced: the Run
    leaves Ready and waits. draining: the host is healthy but takes no Runs: the Run unregisters
    itself there (the acknowledged unregister is its fence), then moves.
    """

    hostId: str
    hostUid: str
    reason: StatusMessage = ""
    fenced: bool = True
    draining: bool = False


class RegistrationLostSignal(ApiModel):
    """To a Run: its host no longer serves its registration (gone without the platform asking, or
    there but not ready). An empty registrationId: the host holds no registration of the Run."""

    runUid: str
    hostUid: str
    registrationId: str = ""
    reason: Literal["Unregistered", "NotReady"] = "Unregistered"
    message: StatusMessage = ""


class ProbeInput(ApiModel):
    hosts: list[Host]
    stateDir: str


class ProbeResult(ApiModel):
    lost: list[str] = Field(default_factory=list)  # host uids proven gone


class Rejection(ApiModel):
    runUid: str
    reason: str
    message: StatusMessage = ""


class HostCommand(ApiModel):
    """To a HostWorkflow: drain its host (take no new Run, move the Runs), or delete it now."""

    action: Literal["drain", "delete"]
    reason: str  # a kruntimes.decisions.hostlife.HostEnd, or Operator
    message: StatusMessage = ""


class Slot(ApiModel):
    """One run slot of one host, held by one Run: what a HostWorkflow keeps of its host's
    reservations (the host is the workflow's own)."""

    runUid: str
    workflowId: str  # the Run's workflow, told when the host is lost or drains
    tenant: str | None = None
    reservedAt: datetime


class SlotRows:
    """A HostWorkflow's slots as it keeps them between handovers: one JSON document of rows (run
    uid, workflow id, tenant, reserved at), ~0.13 KB a slot in a single allocation, where a tuple
    a slot was ~0.29 KB in some 2,500 small objects for a full host (scattered among the worker's
    other objects, they kept its memory from being given back) and the decoded `Slot` model ~0.7
    KB. `slots()` builds the models again for whoever reads them (the `host` query, the read back,
    the digest, continue-as-new): once per handover, not per Run."""

    __slots__ = ("_rows", "_count")

    def __init__(self, slots: Iterable[Slot] = ()) -> None:
        self._rows = b"[]"
        self._count = 0
        self.replace(slots)

    def replace(self, slots: Iterable[Slot]) -> None:
        """Keep `slots`, in their order, instead of what was kept."""
        rows = [[s.runUid, s.workflowId, s.tenant, s.reservedAt.isoformat()] for s in slots]
        self._rows = json.dumps(rows, separators=(",", ":")).encode()  # ASCII, sized exactly
        self._count = len(rows)

    def slots(self) -> list[Slot]:
        return [
            Slot.model_construct(
                runUid=run_uid, workflowId=workflow_id, tenant=tenant, reservedAt=datetime.fromisoformat(at)
            )
            for run_uid, workflow_id, tenant, at in json.loads(self._rows)
        ]

    def __len__(self) -> int:
        return self._count


class HostSlots(ApiModel):
    """The pool to a HostWorkflow, before the pool continues as new: every slot its host holds
    now (the whole set, replacing what the workflow kept). The pool's next run reads them back."""

    hostUid: str
    slots: list[Slot] = Field(default_factory=list)


def slots_digest(host_uid: str, slots: Iterable[Slot]) -> str:
    """A host's slots in 64 characters, the same for the same slots in any order: a HostWorkflow
    answers it (`QUERY_HOST_SLOTS_DIGEST`) so that a handover sends its ~130 B per slot only to
    the hosts whose slots changed since the last one."""
    digest = hashlib.sha256(host_uid.encode())
    for slot in sorted(slots, key=lambda s: s.runUid):
        at = slot.reservedAt if slot.reservedAt.tzinfo is not None else slot.reservedAt.replace(tzinfo=UTC)
        fields = [slot.runUid, slot.workflowId, slot.tenant, at.astimezone(UTC).isoformat()]
        digest.update(b"\n" + json.dumps(fields).encode())
    return digest.hexdigest()


class HostSlotsInput(ApiModel):
    """Read back what a HostWorkflow keeps of its host's slots (the pool after continue-as-new);
    `digest`: the slots_digest of what it was handed, if known."""

    workflowId: str
    hostUid: str
    digest: str = ""


class OutgoingSignal(ApiModel):
    """One message of the pool to one workflow (exactly one payload set): an answer to a Run, or a
    command or the slots to a HostWorkflow."""

    workflowId: str
    assigned: Assignment | None = None
    # The assignment answers a starter's admission: it may wait for its Run in the process where
    # the Run's first task will look for it, instead of being signalled (kruntimes.activities.handoff).
    park: bool = False
    rejected: Rejection | None = None
    hostLost: HostLostSignal | None = None
    command: HostCommand | None = None
    slots: HostSlots | None = None


class SignalBatch(ApiModel):
    signals: list[OutgoingSignal]
    runtime: str = ""  # the pool that answers (its Runs may be waiting in the same process)
    # How long the sending may take (0: unbounded). What is not sent by then comes back unsent:
    # the local activity sending it holds the pool's workflow task open.
    budgetSeconds: float = 0.0


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
    # Not sent within the batch's budget (some may have been: sending one again is harmless).
    unsent: list[OutgoingSignal] = Field(default_factory=list)


# --- RuntimePoolWorkflow ------------------------------------------------------------------------


class AdmitSignal(ApiModel):
    request: AdmissionRequest
    workflowId: str  # where the answer goes
    # A Run moving off a draining host: its slot there (this host uid) is released first.
    leaving: str | None = None
    # Sent by the Run's starter: the Run looks for the answer in its pool's process first, in its
    # first workflow task (kruntimes.activities.handoff), so an answer ready before that task may wait there.
    handoff: bool = False


class AdmitMany(ApiModel):
    """Admissions sent together by one starter (Runs it created at the same time)."""

    admissions: list[AdmitSignal] = Field(max_length=MAX_ADMISSIONS_PER_SIGNAL)


def admit_signal(
    run: Run, *, workflow_id: str, at: datetime, leaving: str | None = None, handoff: bool = False
) -> AdmitSignal:
    """A Run's admission request, the same from the Run itself and from its starter (`handoff`)."""
    assert run.metadata.uid is not None, "a started Run has a uid"
    return AdmitSignal(
        leaving=leaving,
        handoff=handoff,
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


class HostStateSignal(ApiModel):
    """A HostWorkflow to its pool: the host takes no new Run from now on (Draining: its Runs move
    off; Terminating: it is being deleted)."""

    hostId: str
    hostUid: str
    state: HostState
    reason: str = ""


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
    # What the pool's hosts are told about isolation (kruntimes.contracts.providers.host_sandbox).
    hostDefaults: HostDefaults = Field(default_factory=lambda: HostDefaults())


class QueuedRun(ApiModel):
    """A Run waiting in its pool's FIFO: a reference (who, in which tenant scope, where the answer
    goes), never the Run's spec nor its tenant's policy, which is looked up when it is decided."""

    runUid: str
    workflowId: str  # run/{namespace}/{name}: the Run's name is read from it
    tenant: str | None = None
    requestedAt: datetime
    providerHint: str | None = None

    @classmethod
    def of(cls, admit: AdmitSignal) -> QueuedRun:
        r = admit.request
        return cls(
            runUid=r.runUid,
            workflowId=admit.workflowId,
            tenant=r.tenant,
            requestedAt=r.requestedAt,
            providerHint=r.providerHint,
        )

    def request(self, *, runtime: str, policy: TenantPolicy | None) -> AdmissionRequest:
        """The admission request again, with the tenant's policy of now."""
        namespace, name = run_of_workflow_id(self.workflowId)
        return AdmissionRequest(
            runUid=self.runUid,
            namespace=namespace,
            name=name,
            runtime=runtime,
            tenant=self.tenant,
            tenancy=policy if self.tenant is not None else None,
            requestedAt=self.requestedAt,
            providerHint=self.providerHint,
        )

    def admit(self, *, runtime: str) -> AdmitSignal:
        return AdmitSignal(request=self.request(runtime=runtime, policy=None), workflowId=self.workflowId)


def _queued(entry: object) -> object:
    # A queue carried by pools of earlier code holds whole admissions: reduced to references.
    if isinstance(entry, dict) and "request" in entry:
        return QueuedRun.of(AdmitSignal.model_validate(entry))
    if isinstance(entry, AdmitSignal):
        return QueuedRun.of(entry)
    return entry


class PoolState(ApiModel):
    """The pool's state: in full in its `pool` query, and carried across continue-as-new without
    the reservations of the hosts in `slotsOnHosts` (their HostWorkflows keep those; the next run
    reads them back), so that the carried state is bounded by hosts and the queue, not by Runs."""

    hosts: list[Host] = Field(default_factory=list)
    reservations: list[Reservation] = Field(default_factory=list)
    queue: list[QueuedRun] = Field(default_factory=list)
    scaleOuts: list[ScaleOutRequest] = Field(default_factory=list)
    nextHost: int = 0
    failedScaleOuts: int = 0  # consecutive; reset when a host becomes ready
    owners: dict[str, str] = Field(default_factory=dict)  # run uid → the Run's workflow id
    idleSince: dict[str, datetime] = Field(default_factory=dict)  # host uid → holds no reservation since
    # Host uids whose reservations (and their owners) are kept by the host's HostWorkflow, not here.
    slotsOnHosts: list[str] = Field(default_factory=list)
    # Host uid → slots_digest of the slots it was handed: a HostWorkflow whose record shows them
    # is read back with a query, with no update (and no task and events in its history).
    slotsDigests: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _legacy_queue(cls, data: object) -> object:
        if isinstance(data, dict) and isinstance(data.get("queue"), list):
            data = {**data, "queue": [_queued(q) for q in data["queue"]]}
        return data


def carried_state(
    state: PoolState, *, on_hosts: set[str], digests: Mapping[str, str] | None = None
) -> PoolState:
    """What the pool carries across continue-as-new: everything but the reservations (and their
    owners) of the hosts in `on_hosts`, whose HostWorkflows were given them (`digests`: the
    slots_digest of what each was given)."""
    kept = [r for r in state.reservations if r.hostUid not in on_hosts]
    held = {r.runUid for r in kept}
    return state.model_copy(
        update={
            "reservations": kept,
            "owners": {k: v for k, v in state.owners.items() if k in held},
            "slotsOnHosts": sorted(on_hosts),
            "slotsDigests": {uid: d for uid, d in sorted((digests or {}).items()) if uid in on_hosts},
        }
    )


class PoolQuery(ApiModel):
    """What a `pool` query asks for: the state without its reservations and owners
    (`reservations` False), or only the reservations and owners of some hosts (`hosts`: uids).
    The whole state grows ~230 B a Ready Run, past what the server takes as one answer (its
    blob limit, 2 MB: ~9,000 Ready Runs); `kruntimes.temporal.connect.query_pool` reads it in parts of
    POOL_QUERY_SLOTS slots at most."""

    reservations: bool = True
    hosts: list[str] | None = None


POOL_QUERY_SLOTS = 2000  # slots of hosts one part of a pool query covers (~460 KB answered)


def pool_part(
    state: PoolState,
    reservations: Iterable[Reservation],
    owners: Mapping[str, str],
    ask: PoolQuery | None = None,
) -> PoolState:
    """The part of a pool's state that `ask` asks for (None: all of it) from `state` (without
    its reservations and owners, as the pool keeps it), `reservations` and `owners`: with
    `ask.hosts`, only the reservations and owners of those hosts (nothing else of the state)."""
    if ask is not None and not ask.reservations:
        return state.model_copy(update={"reservations": [], "owners": {}})
    wanted = set(ask.hosts) if ask is not None and ask.hosts is not None else None
    held = [r for r in reservations if wanted is None or r.hostUid in wanted]
    whose = {r.runUid: owners[r.runUid] for r in held if r.runUid in owners}
    if wanted is not None:
        return PoolState(reservations=held, owners=whose)
    return state.model_copy(update={"reservations": held, "owners": whose})


def pool_query_parts(hosts: Sequence[Host]) -> list[list[str]]:
    """The hosts' uids in groups of POOL_QUERY_SLOTS slots at most (a host bigger than that alone)."""
    parts: list[list[str]] = []
    slots = 0
    for host in hosts:
        if parts and slots + host.capacity <= POOL_QUERY_SLOTS:
            parts[-1].append(host.hostUid)
            slots += host.capacity
        else:
            parts.append([host.hostUid])
            slots = host.capacity
    return parts


def slots_of(state: PoolState, *, host_uid: str) -> HostSlots:
    """The slots of one host, from the pool's full state (what its HostWorkflow is given)."""
    return HostSlots(
        hostUid=host_uid,
        slots=[
            Slot(
                runUid=r.runUid,
                workflowId=state.owners.get(r.runUid, ""),
                tenant=r.tenant,
                reservedAt=r.reservedAt,
            )
            for r in state.reservations
            if r.hostUid == host_uid
        ],
    )


class PoolMessage(ApiModel):
    """One message the pool received and had not decided on yet when it continued as new
    (exactly one set)."""

    admit: AdmitSignal | None = None
    release: ReleaseSignal | None = None
    hostReady: HostReadySignal | None = None
    scaleOutFailed: ScaleOutFailedSignal | None = None
    configure: PoolConfig | None = None
    hostLost: HostLostSignal | None = None
    hostState: HostStateSignal | None = None

    @classmethod
    def of(cls, msg: object) -> PoolMessage:
        for field, kind in (
            ("admit", AdmitSignal),
            ("release", ReleaseSignal),
            ("hostReady", HostReadySignal),
            ("scaleOutFailed", ScaleOutFailedSignal),
            ("configure", PoolConfig),
            ("hostLost", HostLostSignal),
            ("hostState", HostStateSignal),
        ):
            if isinstance(msg, kind):
                return cls.model_validate({field: msg})
        raise TypeError(f"not a pool message: {type(msg).__name__}")

    @property
    def message(self) -> ApiModel:
        for value in (
            self.admit,
            self.release,
            self.hostReady,
            self.scaleOutFailed,
            self.configure,
            self.hostLost,
            self.hostState,
        ):
            if value is not None:
                return value
        raise ValueError("an empty pool message")


class PoolInput(ApiModel):
    config: PoolConfig
    state: PoolState | None = None  # carried across continue-as-new
    # Messages that arrived while the pool handed its slots to its hosts, in arrival order.
    pending: list[PoolMessage] = Field(default_factory=list)


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
    assignmentTimeoutSeconds: float = Field(default=60.0, gt=0)  # the HostWorkflow's stuck timer


# --- CleanupWorkflow ----------------------------------------------------------------------------


class CleanupInput(ApiModel):
    runUid: str
    attempt: int
    runtime: str
    address: str | None = None  # the host, when the Run had one
    registrationId: str | None = None
    task: bool = False
    graceSeconds: float = 10.0
    # The host is proven gone (fenced): nothing to unregister there, no call to make.
    hostGone: bool = False
    hostId: str = ""
    hostUid: str = ""
    provider: str = ""


class CleanupResult(ApiModel):
    unregistered: bool
    released: bool


# --- RetentionWorkflow --------------------------------------------------------------------------


class RetentionInput(ApiModel):
    """Delete one closed execution of a Run (by run id: a later Run of the same name is another
    execution) from Temporal after `seconds`."""

    workflowId: str
    runId: str
    seconds: float = Field(ge=0)


class DeleteExecutionInput(ApiModel):
    workflowId: str
    runId: str


# --- ScheduledRunWorkflow ----------------------------------------------------------------------


class ScheduledRunInput(ApiModel):
    """What a schedule starts each time: the Run to create (its name is the schedule's, its uid
    unset), named `<schedule name>-<scheduled time>` per start."""

    run: Run
    schedule: str  # the schedule's name


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

    @classmethod
    def of(cls, assignment: Assignment, run: Run, *, run_uid: str, attempt: int, **more: Any) -> Self:
        """Attempt `attempt` of `run` (uid `run_uid`) on the host `assignment` names; `more`: the
        fields of the call's own input."""
        return cls(
            address=assignment.address,
            runUid=run_uid,
            attempt=attempt,
            namespace=run.metadata.namespace,
            name=run.metadata.name,
            runtime=run.spec.runtime,
            adapter=assignment.adapter,
            run=run,
            **more,
        )


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


class HostCall(ApiModel):
    """Which host a call goes to, so that a failed call can ask whether that host is proven gone
    (then the call succeeds: what it would stop cannot be running)."""

    hostId: str = ""
    hostUid: str = ""
    provider: str = ""
    runtime: str = ""


class UnregisterInput(ApiModel):
    address: str
    registrationId: str
    graceSeconds: float = 10.0
    host: HostCall | None = None


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
    host: HostCall | None = None


# --- HostWorkflow -------------------------------------------------------------------------------


class HostEvent(ApiModel):
    """One step of a host's life, as its HostWorkflow recorded it (its audit trail)."""

    at: datetime
    state: HostState
    reason: str
    message: StatusMessage = ""


MAX_HOST_EVENTS = 32


class HostRecord(ApiModel):
    """What a HostWorkflow knows of its host (its `host` query), carried across continue-as-new.

    It is the per-host entity of the pool: it keeps the run slots each Run holds on this host
    while the pool continues as new without them."""

    host: Host
    created: CreatedHost
    state: HostState
    since: datetime
    reason: str = ""
    message: StatusMessage = ""
    fenced: bool = False
    events: list[HostEvent] = Field(default_factory=list, max_length=MAX_HOST_EVENTS)
    # The run slots of this host and the Runs holding them, as the pool last handed them over
    # (before it continued as new; the pool holds the current ones while it runs).
    slots: list[Slot] = Field(default_factory=list)
    # The host's loss journal: the last position a watch took (the next watch resumes after it).
    lostAfter: int | None = Field(default=None, ge=0)


class HostInput(ApiModel):
    host: Host
    created: CreatedHost
    poolWorkflowId: str
    stateDir: str
    watchIntervalSeconds: float = Field(default=5.0, gt=0, le=300)
    assignmentTimeoutSeconds: float = Field(default=60.0, gt=0)
    record: HostRecord | None = None  # carried across continue-as-new


class ProviderReport(ApiModel):
    """The host's provider (e.g. a pod watch) to its HostWorkflow: the host is lost, or not ready
    (to the platform both mean lost: it is fenced and its Runs move)."""

    lost: bool = True
    ready: bool = False
    reason: str = "ProviderLost"
    message: StatusMessage = ""
    hostUid: str = ""  # the incarnation it is about; empty: whichever the workflow supervises


class HostActionInput(ApiModel):
    """An operator's drain or delete of a host (the Update's argument)."""

    message: StatusMessage = ""
    requestedBy: str = ""


class HostActionResult(ApiModel):
    """The acknowledged result of an operator's drain or delete: the host's state once the pool
    was told (Draining: takes no new Run and its Runs move; Terminating then gone: fenced)."""

    hostId: str
    hostUid: str
    runtime: str
    state: HostState
    accepted: bool
    message: StatusMessage = ""


class HostResult(ApiModel):
    hostId: str
    hostUid: str
    state: HostState
    reason: str
    message: StatusMessage = ""


class WatchInput(ApiModel):
    runtime: str
    hostId: str
    hostUid: str
    address: str
    intervalSeconds: float = Field(gt=0, le=300)
    # Tell the HostWorkflow (`watch_ready`) at the first report that says the host serves; the
    # watch goes on, so that nothing the host does between that report and the next goes unseen.
    tellReady: bool = False
    maxSeconds: float = Field(default=3600.0, gt=0)  # then return Renew (bounds one activity)
    # Where the previous watch of this incarnation left the host's loss journal: this one resumes
    # after it, so a loss between two watches is told too. None: from the first report on.
    lostAfter: int | None = Field(default=None, ge=0)


class WatchReady(ApiModel):
    """The watch to its HostWorkflow: the host reported that it serves."""

    hostUid: str
    message: StatusMessage = ""


class WatchResult(ApiModel):
    verdict: Literal["Lost", "Renew"]
    reason: str = ""  # a kruntimes.decisions.hostlife.LossReason when Lost
    message: StatusMessage = ""
    lostAfter: int | None = Field(default=None, ge=0)  # the journal's last position it took


class DeleteHostInput(ApiModel):
    """Delete one incarnation of a host through its provider (idempotent: absent is success)."""

    provider: str
    runtime: str
    hostId: str
    hostUid: str


class FenceInput(ApiModel):
    created: CreatedHost
    stateDir: str


class FenceResult(ApiModel):
    fenced: bool
    how: StatusMessage = ""


# --- ReconcileWorkflow --------------------------------------------------------------------------


MAX_REPORTED = 100


class ReconcileReport(ApiModel):
    """What one reconciliation round found and did (bounded lists; `actions` counts them all)."""

    runtime: str = ""
    at: datetime
    unregistered: list[str] = Field(default_factory=list, max_length=MAX_REPORTED)
    released: list[str] = Field(default_factory=list, max_length=MAX_REPORTED)
    deletedHosts: list[str] = Field(default_factory=list, max_length=MAX_REPORTED)
    removedWorkspaces: list[str] = Field(default_factory=list, max_length=MAX_REPORTED)
    registrationsLost: list[str] = Field(default_factory=list, max_length=MAX_REPORTED)
    supervised: list[str] = Field(default_factory=list, max_length=MAX_REPORTED)
    errors: list[StatusMessage] = Field(default_factory=list, max_length=MAX_REPORTED)
    actions: int = 0


class ReconcileInput(ApiModel):
    runtime: str
    poolWorkflowId: str
    stateDir: str
    runTaskQueue: str = TASK_QUEUE
    intervalSeconds: float | None = Field(default=60.0, gt=0)  # None: only when asked
    # What is younger than this is being created right now and is left alone (twice the
    # runtime's assignment timeout).
    graceSeconds: float = Field(default=120.0, ge=0)
    # For the HostWorkflows it starts again (hosts whose supervisor is gone).
    watchIntervalSeconds: float = Field(default=5.0, gt=0, le=300)
    assignmentTimeoutSeconds: float = Field(default=60.0, gt=0)
    last: ReconcileReport | None = None  # carried across continue-as-new


def ready_host(
    created: CreatedHost,
    *,
    capacity: int,
    at: datetime,
    tenant: str | None = None,
    tenancy: TenancyMode = TenancyMode.Shared,
    supervised: bool = False,
) -> Host:
    """The pool's record of a host its provider created (``created``) and that serves: Ready since
    ``at``, with ``capacity`` run slots, labelled with its provider."""
    return Host(
        hostId=created.hostId,
        hostUid=created.hostUid,
        runtime=created.runtime,
        address=created.address,
        state=HostState.Ready,
        capacity=capacity,
        tenant=tenant,
        tenancy=tenancy,
        createdAt=created.createdAt,
        labels={PROVIDER_LABEL: created.provider},
        assignedAt=at,
        readyAt=at,
        supervised=supervised,
    )


def register_input(assignment: Assignment, run: Run, *, run_uid: str, attempt: int) -> RegisterInput:
    """What registering attempt `attempt` of `run` on its assigned host sends, whether the Run
    registers (RunWorkflow) or the worker's handoff registers attempt 1 for it."""
    return RegisterInput.of(
        assignment,
        run,
        run_uid=run_uid,
        attempt=attempt,
        hostId=assignment.hostId,
        hostUid=assignment.hostUid,
    )


def host_input(starter: ScaleOutInput | ReconcileInput, *, host: Host, created: CreatedHost) -> HostInput:
    """The input of the HostWorkflow that supervises ``host`` (``created``: its provider's record),
    started by the ScaleOutWorkflow that created it or by the reconciler for a host whose
    supervisor is gone. The pool, the state directory and the stuck timer are the starter's; a
    new host is watched at the interval it heartbeats at, a reconciled one at the reconciler's."""
    if isinstance(starter, ScaleOutInput):
        watch = starter.heartbeatIntervalSeconds
    else:
        watch = starter.watchIntervalSeconds
    return HostInput(
        host=host,
        created=created,
        poolWorkflowId=starter.poolWorkflowId,
        stateDir=starter.stateDir,
        watchIntervalSeconds=watch,
        assignmentTimeoutSeconds=starter.assignmentTimeoutSeconds,
    )
