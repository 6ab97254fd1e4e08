"""FunctionWorkflow's contract: its input (and the state it carries across continue-as-new), its
updates and queries, what a replica Run is told about the Function that owns it, and what a
replica tells the Function back.

A Function's replicas are child RunWorkflows (`run_workflow_id(ns, replica_name)`), each started
with `RunInput.replicaOf`; a replica signals its phase to the Function (`SIGNAL_REPLICA_PHASE`).
"""

from __future__ import annotations

import hashlib
from typing import Annotated

from pydantic import AfterValidator, AwareDatetime, Field

from kruntimes.api._base import ApiModel, StatusMessage, StrictInt
from kruntimes.api.function import (
    MAX_STABLE_WINDOW_SECONDS,
    MIN_STABLE_WINDOW_SECONDS,
    Function,
    FunctionSpec,
    ScaleEvent,
)
from kruntimes.api.ids import RunUid
from kruntimes.api.limits import (
    MAX_FUNCTION_CONCURRENCY,
    MAX_FUNCTION_NAME_CHARS,
    MAX_FUNCTION_REPLICAS,
    MAX_SCALE_DOWN_DELAY_SECONDS,
)
from kruntimes.api.names import validate_dns1123_label, validate_run_uid
from kruntimes.api.phases import TERMINAL_PHASES, RunPhase
from kruntimes.api.status import Endpoint
from kruntimes.decisions.autoscale import MAX_CARRIED_SAMPLES, MAX_CARRIED_WANTED

# Labels every replica Run carries (its Function's name, its revision as a decimal string).
FUNCTION_LABEL = "kruntimes.io/function"
REVISION_LABEL = "kruntimes.io/revision"
# A replica's phase, from the replica's RunWorkflow to its Function's workflow.
SIGNAL_REPLICA_PHASE = "replica_phase"
# The Function's query: its manifest (the current revision's spec) with its status (a Function).
QUERY_FUNCTION = "function"
# The memo the FunctionWorkflow writes its status to (a FunctionStatus), as a Run writes its own.
FUNCTION_STATUS_MEMO = "krtStatus"
# What a FunctionConflict adds: why a uid that differs is not the same Function.
FUNCTION_CONFLICT_HINT = "a Function deleted and created again is another Function, with a new uid"
# What a replica may tell of its host's address and its registration there (both opaque).
MAX_ADDRESS_CHARS = 512
MAX_REGISTRATION_ID_CHARS = 256
# Revisions whose template a Function keeps: the current one and the one `rollback` goes back to
# (each holds a whole spec, and the state crosses continue-as-new in one payload).
MAX_REVISIONS_KEPT = 2


def _function_uid(value: str) -> str:
    return validate_run_uid(value, field="functionUid")


def _function_name(value: str) -> str:
    validate_dns1123_label(value, field="functionName")
    if len(value) > MAX_FUNCTION_NAME_CHARS:
        raise ValueError(f"functionName: at most {MAX_FUNCTION_NAME_CHARS} characters")
    return value


FunctionUid = Annotated[str, AfterValidator(_function_uid)]
FunctionName = Annotated[str, AfterValidator(_function_name)]


class ReplicaOf(ApiModel):
    """The Function a replica Run serves (RunInput.replicaOf). A RunWorkflow takes it only from
    its parent, the Function's own workflow: a user cannot make a Run that takes a Function's
    traffic. Its host's signed assignment carries the uid and revision (the gateway's routes)."""

    functionUid: FunctionUid
    functionName: FunctionName
    revision: StrictInt = Field(ge=1)


def replica_name(function: str, revision: int, seed: str) -> str:
    """A replica Run's name: `<function>-r<revision>-<5 hex>` (`seed`: unique per replica, say the
    replica's uid), a DNS-1123 label for any Function name of at most MAX_FUNCTION_NAME_CHARS."""
    suffix = hashlib.sha256(seed.encode()).hexdigest()[:5]
    return f"{function}-r{revision}-{suffix}"


class ReplicaPhase(ApiModel):
    """A replica's phase, as its RunWorkflow tells its Function on every indexed phase change."""

    runUid: RunUid
    name: str
    revision: StrictInt = Field(ge=1)
    phase: RunPhase
    reason: str = ""
    message: StatusMessage = ""
    # One more with each phase a replica tells: an older one arriving late is ignored.
    seq: StrictInt = Field(default=0, ge=0)
    # Where the replica's platform serves invocations (its assignment's): the Function's URL base.
    gatewayUrl: str = ""
    caBundle: str | None = None
    # Where the replica is registered (its host's Runtime Server and the registration there), so
    # the autoscaler can ask the host for its load; empty until it has a host.
    address: str = Field(default="", max_length=MAX_ADDRESS_CHARS)
    registrationId: str = Field(default="", max_length=MAX_REGISTRATION_ID_CHARS)


class ReplicaView(ApiModel):
    """One replica, as the `replicas` query lists it. `phase` is the replica Run's phase as last
    told, or Deleting once the Function asked it to go."""

    runUid: RunUid
    name: str
    revision: StrictInt
    phase: str


class Replica(ApiModel):
    """What the FunctionWorkflow keeps of one replica (carried across continue-as-new)."""

    runUid: RunUid
    name: str
    runId: str = ""  # its RunWorkflow's first run id, once started
    revision: StrictInt
    phase: RunPhase = RunPhase.Pending
    reason: str = ""
    message: StatusMessage = ""
    startedAt: AwareDatetime
    # The Function asked the Run to go (its delete update): it takes no part in `wanted`.
    deleting: bool = False
    # The delete was accepted or the Run proved gone: only its terminal phase is awaited.
    deleteSent: bool = False
    # Whether this replica was ever Ready (a replica that ends before it is a failure).
    wasReady: bool = False
    seq: StrictInt = Field(default=0, ge=0)  # the last ReplicaPhase.seq taken
    # Its host's address and registration, as it last told (the autoscaler's load targets).
    address: str = Field(default="", max_length=MAX_ADDRESS_CHARS)
    registrationId: str = Field(default="", max_length=MAX_REGISTRATION_ID_CHARS)

    def view(self) -> ReplicaView:
        phase = "Deleting" if self.deleting and self.phase not in TERMINAL_PHASES else self.phase.value
        return ReplicaView(runUid=self.runUid, name=self.name, revision=self.revision, phase=phase)


class Revision(ApiModel):
    revision: StrictInt = Field(ge=1)
    spec: FunctionSpec
    createdAt: AwareDatetime


class ScaleWindow(ApiModel):
    """The autoscaler's memory (kruntimes.decisions.autoscale.Snapshot), bounded: it crosses the
    workflow's history as an activity's result and the next one's input. Times are epoch
    seconds: the activity samples with the wall clock, on whichever worker runs it."""

    samples: list[tuple[float, float]] = Field(default_factory=list, max_length=MAX_CARRIED_SAMPLES)
    wanted: list[tuple[float, int]] = Field(default_factory=list, max_length=MAX_CARRIED_WANTED)
    panicUntil: float | None = None
    lastAt: float | None = None


class LoadTarget(ApiModel):
    """A Ready replica whose host the autoscaler asks for its load (FunctionStatus)."""

    runUid: RunUid
    address: str = Field(min_length=1, max_length=MAX_ADDRESS_CHARS)
    registrationId: str = Field(min_length=1, max_length=MAX_REGISTRATION_ID_CHARS)


class AutoscaleInput(ApiModel):
    """The autoscaling activity: sample the Function's load every second, decide, and return
    once the replicas wanted differ from `current` (or after `maxSeconds`, or when cancelled:
    then with nothing changed, only its memory)."""

    functionUid: FunctionUid
    namespace: str
    name: FunctionName
    min: StrictInt = Field(ge=0, le=MAX_FUNCTION_REPLICAS)
    max: StrictInt = Field(ge=1, le=MAX_FUNCTION_REPLICAS)
    target: float = Field(gt=0, le=MAX_FUNCTION_CONCURRENCY)
    scaleDownDelaySeconds: float = Field(ge=0, le=MAX_SCALE_DOWN_DELAY_SECONDS)
    stableWindowSeconds: float = Field(ge=MIN_STABLE_WINDOW_SECONDS, le=MAX_STABLE_WINDOW_SECONDS)
    current: StrictInt = Field(ge=0, le=MAX_FUNCTION_REPLICAS)
    replicas: list[LoadTarget] = Field(default_factory=list, max_length=2 * MAX_FUNCTION_REPLICAS)
    window: ScaleWindow | None = None
    maxSeconds: float = Field(default=300.0, gt=0, le=3600)


class AutoscaleResult(ApiModel):
    """What the autoscaler concluded (autoscale.Decision) and its memory to carry on with."""

    changed: bool
    previous: StrictInt = Field(ge=0)
    wanted: StrictInt = Field(ge=0)
    reason: StatusMessage = ""
    message: StatusMessage = ""  # Decision.describe(): from, to, why and the loads
    stableLoad: float = 0.0
    panicLoad: float = 0.0
    panicking: bool = False
    window: ScaleWindow = Field(default_factory=ScaleWindow)


class FunctionState(ApiModel):
    """Everything a FunctionWorkflow knows, carried across continue-as-new."""

    # Oldest first; the last is the current revision. At most MAX_REVISIONS_KEPT.
    revisions: list[Revision] = Field(min_length=1, max_length=MAX_REVISIONS_KEPT)
    wanted: StrictInt = Field(ge=0, le=MAX_FUNCTION_REPLICAS)
    replicas: list[Replica] = Field(default_factory=list)
    observedRevision: StrictInt = Field(default=0, ge=0)
    # Replicas that ended before ever being Ready, in a row: what the start backoff counts.
    failures: StrictInt = Field(default=0, ge=0)
    # No replica is started before this (the backoff after failures).
    retryAt: AwareDatetime | None = None
    lastFailure: StatusMessage = ""
    deleting: bool = False
    # Replicas started so far, all revisions.
    started: StrictInt = Field(default=0, ge=0)
    # When the current revision's rollout began (None: it is done); bounded by the workflow.
    rolloutSince: AwareDatetime | None = None
    # Whether the Function was ever Ready (then fewer Ready than wanted is Degraded, not Pending).
    everReady: bool = False
    # The Function's endpoint, known once a replica told its platform's gateway URL.
    endpoint: Endpoint | None = None
    # The autoscaler's memory, as its last activity returned it, and its last change.
    scaleWindow: ScaleWindow | None = None
    lastScale: ScaleEvent | None = None


class FunctionInput(ApiModel):
    """The FunctionWorkflow's input: the Function (metadata.uid set by the starter) and, after a
    continue-as-new, the state it carries."""

    function: Function
    state: FunctionState | None = None


class ApplyResult(ApiModel):
    """What `apply` and `rollback` answer: the current revision, and whether this call made it."""

    revision: StrictInt
    changed: bool
    message: StatusMessage = ""


class ScaleInput(ApiModel):
    """The `scale` update: replicas wanted, within the Function's scale.min..scale.max."""

    replicas: StrictInt = Field(ge=0, le=MAX_FUNCTION_REPLICAS)
    reason: StatusMessage = ""


class ScaleResult(ApiModel):
    previous: StrictInt
    wanted: StrictInt


class DeleteReplicaInput(ApiModel):
    """The activity asking one replica's RunWorkflow to delete itself (its delete update,
    accepted, not awaited: the replica's terminal phase comes back by signal)."""

    workflowId: str
    runId: str = ""  # the replica's own run (its first), so a later Run of its name is never asked
    runUid: RunUid


class DeleteReplicaResult(ApiModel):
    # False: the Run's workflow no longer runs (nothing to wait for).
    accepted: bool


def revision_of(state: FunctionState, revision: int) -> Revision | None:
    return next((r for r in state.revisions if r.revision == revision), None)
