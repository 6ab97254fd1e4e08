"""RunWorkflow's contract: its input, its signals (assignment, rejection, host loss) and the
batched signals it sends.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Literal

from pydantic import Field

from kruntimes.api._base import ApiModel, StatusMessage
from kruntimes.api.ids import HostId, HostUid, RuntimeName, RunUid
from kruntimes.api.run import Run
from kruntimes.contracts.function import ReplicaOf
from kruntimes.contracts.platform_info import PlatformInfo
from kruntimes.decisions.scheduling.model import (
    Host,
)


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
    # A Function's replica: set only by the Function's own workflow, the Run's parent (the Run
    # fails at once when its parent is any other workflow); its host's assignment carries it.
    replicaOf: ReplicaOf | None = None


# The memo the Run writes its status (a RunStatus, through the data converter and its codec) to.
STATUS_MEMO = "krtStatus"


class Assignment(ApiModel):
    runUid: RunUid
    hostId: HostId
    hostUid: HostUid
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

    hostId: HostId
    hostUid: HostUid
    reason: StatusMessage = ""
    fenced: bool = True
    draining: bool = False


class RegistrationLostSignal(ApiModel):
    """To a Run: its host no longer serves its registration (gone without the platform asking, or
    there but not ready). An empty registrationId: the host holds no registration of the Run."""

    runUid: RunUid
    hostUid: HostUid
    registrationId: str = ""
    reason: Literal["Unregistered", "NotReady"] = "Unregistered"
    message: StatusMessage = ""


class ProbeInput(ApiModel):
    hosts: list[Host]
    stateDir: str


class ProbeResult(ApiModel):
    lost: list[str] = Field(default_factory=list)  # host uids proven gone


class Rejection(ApiModel):
    runUid: RunUid
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

    runUid: RunUid
    workflowId: str  # the Run's workflow, told when the host is lost or drains
    tenant: str | None = None
    reservedAt: datetime


class SlotRows:
    """A HostWorkflow's slots as it keeps them between handovers: one JSON document of rows (run
    uid, workflow id, tenant, reserved at) in a single allocation, not thousands of small objects
    for a full host (scattered among the worker's other objects, they keep its memory from being
    given back) nor a decoded `Slot` model each. `slots()` builds the models again for whoever
    reads them (the `host` query, the read back, the digest, continue-as-new): once per
    handover, not per Run."""

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

    hostUid: HostUid
    slots: list[Slot] = Field(default_factory=list)


def slots_digest(host_uid: HostUid, slots: Iterable[Slot]) -> str:
    """A host's slots in 64 characters, the same for the same slots in any order: a HostWorkflow
    answers it (`QUERY_HOST_SLOTS_DIGEST`) so that a handover sends its slots only to the
    hosts whose slots changed since the last one."""
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
    hostUid: HostUid
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
    # the pool that answers (its Runs may be waiting in the same process)
    runtime: RuntimeName = RuntimeName("")
    # How long the sending may take (0: unbounded). What is not sent by then comes back unsent:
    # the local activity sending it holds the pool's workflow task open.
    budgetSeconds: float = 0.0


class AwaitAssignmentInput(ApiModel):
    """A Run waiting, within its first workflow task, for its pool's answer in this process;
    with `run`, the activity also registers attempt 1 on the assigned host (a replica's with its
    `replicaOf`, which its signed assignment names)."""

    workflowId: str
    runUid: RunUid
    runtime: RuntimeName
    timeoutSeconds: float
    run: Run | None = None
    replicaOf: ReplicaOf | None = None


class SignalResult(ApiModel):
    unreachable: list[str] = Field(default_factory=list)  # workflow ids that are gone
    # Not sent within the batch's budget (some may have been: sending one again is harmless).
    unsent: list[OutgoingSignal] = Field(default_factory=list)
