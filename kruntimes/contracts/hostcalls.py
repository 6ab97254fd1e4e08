"""What activities send a runtime host and get back: registrations, tasks, status and
unregistration.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Self

from kruntimes.api._base import ApiModel, StatusMessage
from kruntimes.api.ids import HostId, HostUid, Namespace, RuntimeName, RunUid
from kruntimes.api.run import Run
from kruntimes.contracts.function import ReplicaOf
from kruntimes.contracts.run import Assignment


class RunOnHost(ApiModel):
    """A Run's attempt on one host: what registering a function and executing a task both send."""

    address: str
    runUid: RunUid
    attempt: int
    namespace: Namespace
    name: str
    runtime: RuntimeName
    adapter: str
    run: Run

    @classmethod
    def of(cls, assignment: Assignment, run: Run, *, run_uid: RunUid, attempt: int, **more: Any) -> Self:
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
    hostId: HostId
    hostUid: HostUid
    # A Function's replica: the signed assignment names the Function's uid and the revision.
    replicaOf: ReplicaOf | None = None


class RegisterResult(ApiModel):
    registrationId: str
    hostUid: HostUid
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
    inFlight: int = 0  # invocations running
    waiting: int = 0  # invocations queued for their turn
    lastActivity: datetime | None = None
    hostUid: HostUid = HostUid("")


class HostCall(ApiModel):
    """Which host a call goes to, so that a failed call can ask whether that host is proven gone
    (then the call succeeds: what it would stop cannot be running)."""

    hostId: HostId = HostId("")
    hostUid: HostUid = HostUid("")
    provider: str = ""
    runtime: RuntimeName = RuntimeName("")


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
    errorType: str = ""  # the adapter's error class (HandlerError, ProcessExited, ...), "" when none


class CancelTaskInput(ApiModel):
    address: str
    runUid: RunUid
    attempt: int
    host: HostCall | None = None


def register_input(
    assignment: Assignment, run: Run, *, run_uid: RunUid, attempt: int, replica_of: ReplicaOf | None = None
) -> RegisterInput:
    """What registering attempt `attempt` of `run` on its assigned host sends, whether the Run
    registers (RunWorkflow) or the worker's handoff registers attempt 1 for it."""
    return RegisterInput.of(
        assignment,
        run,
        run_uid=run_uid,
        attempt=attempt,
        hostId=assignment.hostId,
        hostUid=assignment.hostUid,
        replicaOf=replica_of,
    )
