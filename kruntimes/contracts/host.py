"""HostWorkflow's contract: a host's record, its events and actions, and its watch."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from kruntimes.api._base import ApiModel, StatusMessage
from kruntimes.api.ids import HostId, HostUid, RuntimeName
from kruntimes.contracts.providers import CreatedHost
from kruntimes.contracts.reconcile import ReconcileInput
from kruntimes.contracts.run import Slot
from kruntimes.contracts.scaleout import ScaleOutInput
from kruntimes.decisions.scheduling.model import (
    Host,
    HostState,
)


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
    hostUid: HostUid = HostUid("")  # the incarnation it is about; empty: whichever the workflow supervises


class HostActionInput(ApiModel):
    """An operator's drain or delete of a host (the Update's argument)."""

    message: StatusMessage = ""
    requestedBy: str = ""


class HostActionResult(ApiModel):
    """The acknowledged result of an operator's drain or delete: the host's state once the pool
    was told (Draining: takes no new Run and its Runs move; Terminating then gone: fenced)."""

    hostId: HostId
    hostUid: HostUid
    runtime: RuntimeName
    state: HostState
    accepted: bool
    message: StatusMessage = ""


class HostResult(ApiModel):
    hostId: HostId
    hostUid: HostUid
    state: HostState
    reason: str
    message: StatusMessage = ""


class WatchInput(ApiModel):
    runtime: RuntimeName
    hostId: HostId
    hostUid: HostUid
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

    hostUid: HostUid
    message: StatusMessage = ""


class WatchResult(ApiModel):
    verdict: Literal["Lost", "Renew"]
    reason: str = ""  # a kruntimes.decisions.hostlife.LossReason when Lost
    message: StatusMessage = ""
    lostAfter: int | None = Field(default=None, ge=0)  # the journal's last position it took


class DeleteHostInput(ApiModel):
    """Delete one incarnation of a host through its provider (idempotent: absent is success)."""

    provider: str
    runtime: RuntimeName
    hostId: HostId
    hostUid: HostUid


class FenceInput(ApiModel):
    created: CreatedHost
    stateDir: str


class FenceResult(ApiModel):
    fenced: bool
    how: StatusMessage = ""


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
