"""RuntimePoolWorkflow's contract: admission signals, its configuration, its carried state and
its query.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from pydantic import Field, model_validator

from kruntimes.api._base import ApiModel, StatusMessage
from kruntimes.api.ids import HostId, HostUid, RuntimeName, RunUid
from kruntimes.api.run import Run
from kruntimes.config.runtimes import RuntimeConfig, TenantConfig
from kruntimes.contracts.names import MAX_ADMISSIONS_PER_SIGNAL, TASK_QUEUE, run_of_workflow_id
from kruntimes.contracts.platform_info import PlatformInfo
from kruntimes.contracts.providers import CreatedHost, HostDefaults
from kruntimes.contracts.run import HostLostSignal, HostSlots, Rejection, Slot
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


class AdmitSignal(ApiModel):
    request: AdmissionRequest
    workflowId: str  # where the answer goes
    # A Run moving off a draining host: its slot there (this host uid) is released first.
    leaving: HostUid | None = None
    # Sent by the Run's starter: the Run looks for the answer in its pool's process first, in its
    # first workflow task (kruntimes.activities.handoff), so an answer ready before that task may wait there.
    handoff: bool = False


class AdmitMany(ApiModel):
    """Admissions sent together by one starter (Runs it created at the same time)."""

    admissions: list[AdmitSignal] = Field(max_length=MAX_ADMISSIONS_PER_SIGNAL)


def admit_signal(
    run: Run, *, workflow_id: str, at: datetime, leaving: HostUid | None = None, handoff: bool = False
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
    runUid: RunUid


class HostReadySignal(ApiModel):
    requestId: str
    host: Host


class HostStateSignal(ApiModel):
    """A HostWorkflow to its pool: the host takes no new Run from now on (Draining: its Runs move
    off; Terminating: it is being deleted)."""

    hostId: HostId
    hostUid: HostUid
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

    runUid: RunUid
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

    def request(self, *, runtime: RuntimeName, policy: TenantPolicy | None) -> AdmissionRequest:
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

    def admit(self, *, runtime: RuntimeName) -> AdmitSignal:
        return AdmitSignal(request=self.request(runtime=runtime, policy=None), workflowId=self.workflowId)


def _queued(entry: object) -> object:
    # A queue carried by pools of earlier code holds whole admissions: reduced to references.
    if isinstance(entry, dict) and "request" in entry:
        return QueuedRun.of(AdmitSignal.model_validate(entry))
    if isinstance(entry, AdmitSignal):
        return QueuedRun.of(entry)
    return entry


QUEUE_DRAINED = "QueueDrained"  # the reason a queued Run ends with when an operator drains its queue


class QueueActionInput(ApiModel):
    """An operator's pause, resume or drain of a runtime's admission (the Update's argument, kept
    in the pool's history: who asked and why)."""

    message: StatusMessage = ""
    requestedBy: str = Field(default="", max_length=253)


class AdmissionControl(ApiModel):
    """What operators set on a runtime's admission: paused (new Runs queue, none is placed) and a
    drain not applied yet (the queued Runs end with QUEUE_DRAINED)."""

    paused: bool = False
    by: str = ""  # who paused or resumed last
    message: StatusMessage = ""
    since: datetime | None = None
    drain: QueueActionInput | None = None  # asked, not applied yet
    decideAgain: bool = False  # resumed: the queue is decided again (it queued without scale-outs)


class QueueActionResult(ApiModel):
    """The acknowledged result of a pause, resume or drain."""

    runtime: RuntimeName
    paused: bool
    queued: int  # Runs in the queue when the pool took the action
    message: StatusMessage = ""


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
    slotsOnHosts: list[HostUid] = Field(default_factory=list)
    # Host uid → slots_digest of the slots it was handed: a HostWorkflow whose record shows them
    # is read back with a query, with no update (and no task and events in its history).
    slotsDigests: dict[str, str] = Field(default_factory=dict)
    admission: AdmissionControl = Field(default_factory=AdmissionControl)

    @model_validator(mode="before")
    @classmethod
    def _legacy_queue(cls, data: object) -> object:
        if isinstance(data, dict) and isinstance(data.get("queue"), list):
            data = {**data, "queue": [_queued(q) for q in data["queue"]]}
        return data


def carried_state(
    state: PoolState, *, on_hosts: set[HostUid], digests: Mapping[HostUid, str] | None = None
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
    The whole state grows with every Ready Run, past what the server takes as one answer (its
    blob limit, 2 MB); `kruntimes.temporal.connect.query_pool` reads it in parts of
    POOL_QUERY_SLOTS slots at most."""

    reservations: bool = True
    hosts: list[str] | None = None


POOL_QUERY_SLOTS = 2000  # slots of hosts one part of a pool query covers: well below the blob limit


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


def slots_of(state: PoolState, *, host_uid: HostUid) -> HostSlots:
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


def ready_host(
    created: CreatedHost,
    *,
    capacity: int,
    at: datetime,
    tenant: str | None = None,
    tenancy: TenancyMode = TenancyMode.Shared,
    tenant_group: str | None = None,
    supervised: bool = False,
) -> Host:
    """The pool's record of a host its provider created (``created``) and that serves: Ready since
    ``at``, with ``capacity`` run slots, labelled with its provider, owned by ``tenant`` and
    ``tenant_group`` (every tenant of the group sees it, as it saw the scale-out)."""
    return Host(
        hostId=created.hostId,
        hostUid=created.hostUid,
        runtime=created.runtime,
        address=created.address,
        state=HostState.Ready,
        capacity=capacity,
        tenant=tenant,
        tenantGroup=tenant_group,
        tenancy=tenancy,
        createdAt=created.createdAt,
        labels={PROVIDER_LABEL: created.provider},
        assignedAt=at,
        readyAt=at,
        supervised=supervised,
    )
