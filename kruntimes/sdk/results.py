"""What the SDK's calls return: a Run as the platform holds it, apply's outcome, a Function as
the platform holds it and its apply's outcome, a pool host's view, the answer of an
invocation that ran, and an async invocation: its acceptance and its status."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kruntimes.api.function import Function, FunctionStatus
from kruntimes.api.run import Run
from kruntimes.api.status import RunStatus
from kruntimes.contracts.invocation import TERMINAL_STATES, InvocationState
from kruntimes.decisions.scheduling.model import Host


class RunObject(Run):
    """A Run as the platform holds it: the manifest it was created with, and its current status."""

    status: RunStatus = Field(default_factory=RunStatus)
    # When its workflow started, and whether it has ended (deleted or expired): not manifest fields.
    created: datetime | None = Field(default=None, exclude=True)
    closed: bool = Field(default=False, exclude=True)

    @classmethod
    def of(
        cls, run: Run, status: RunStatus, *, created: datetime | None = None, closed: bool = False
    ) -> RunObject:
        """The manifest `run` as the platform holds it, with `status`."""
        return cls(
            apiVersion=run.apiVersion,
            kind=run.kind,
            metadata=run.metadata,
            spec=run.spec,
            status=status,
            created=created,
            closed=closed,
        )

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace

    @property
    def uid(self) -> str:
        return self.metadata.uid or ""

    def manifest(self) -> dict[str, Any]:
        """The Run object as `krt ... -o json` prints it: apiVersion, kind, metadata, spec, status."""
        return self.model_dump(mode="json", exclude_none=True)


@dataclass(frozen=True)
class Applied:
    run: RunObject
    created: bool  # False: an identical Run was already there


class FunctionObject(Function):
    """A Function as the platform holds it: its manifest (the current revision's spec) and status."""

    status: FunctionStatus = Field(default_factory=FunctionStatus)
    # When its workflow started: not a manifest field.
    created: datetime | None = Field(default=None, exclude=True)

    @classmethod
    def of(
        cls, function: Function, status: FunctionStatus, *, created: datetime | None = None
    ) -> FunctionObject:
        """The manifest `function` as the platform holds it, with `status`."""
        return cls(
            apiVersion=function.apiVersion,
            kind=function.kind,
            metadata=function.metadata,
            spec=function.spec,
            status=status,
            created=created,
        )

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace

    @property
    def uid(self) -> str:
        return self.metadata.uid or ""

    def manifest(self) -> dict[str, Any]:
        """The Function as `krt ... -o json` prints it: apiVersion, kind, metadata, spec, status."""
        return self.model_dump(mode="json", exclude_none=True)


@dataclass(frozen=True)
class FunctionApplied:
    function: FunctionObject
    # created: it is new; configured: the running one took the manifest (a new revision when
    # the replicas' template changed); unchanged: it held that manifest already
    action: Literal["created", "configured", "unchanged"]


class Captured(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    data: str = ""
    truncated: bool = False
    totalBytes: int = 0


class InvokeResult(BaseModel):
    """The gateway's answer to one invocation that ran (HTTP 200)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    invocationId: str
    status: str  # Succeeded | HandlerError | InvalidOutput
    outputs: Any = None
    stdout: Captured = Field(default_factory=Captured)
    stderr: Captured = Field(default_factory=Captured)
    durationMs: float = 0.0
    error: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "Succeeded"


@dataclass(frozen=True)
class HostView:
    host: Host
    used: int  # run slots reserved on it


class AsyncInvocation(BaseModel):
    """An async invocation the gateway accepted (202): recorded, to run once per id."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    invocationId: str
    state: InvocationState
    location: str  # the invocation's URL (absolute): `client.invocations.get(location)`


class _Read(BaseModel):
    """A part of an answer the SDK reads: what it does not know yet (a newer gateway's field) is
    ignored, not refused."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class InvocationTargetRef(_Read):
    kind: str  # Run | Function
    namespace: str
    name: str = ""  # "" when the gateway knew only the uid
    uid: str
    runtime: str = ""  # a Run's; "" for a Function


class InvocationAttempt(_Read):
    n: int
    startedAt: datetime
    endedAt: datetime | None = None
    httpStatus: int = 0
    reason: str = ""
    dispatched: bool = False  # False: the function provably did not run in this attempt


class InvocationReason(_Read):
    reason: str
    message: str = ""


class InvocationCallback(_Read):
    url: str
    delivered: bool = False
    attempts: int = 0
    failures: list[InvocationReason] = Field(default_factory=list)  # the last ones


class Invocation(_Read):
    """An async invocation's status as the gateway answers it (GET …/invocations/{id};
    kruntimes.contracts.invocation.InvocationStatus)."""

    invocationId: str
    target: InvocationTargetRef
    state: InvocationState
    acceptedAt: datetime
    startedAt: datetime | None = None  # its first attempt's dispatch
    endedAt: datetime | None = None
    expiresAt: datetime | None = None  # when its id and result are forgotten
    attempts: list[InvocationAttempt] = Field(default_factory=list)  # the first and the last ones
    attemptCount: int = 0  # every attempt made
    result: str | None = None  # the last attempt's sync answer (JSON); `answer()` parses it
    error: InvocationReason | None = None  # why Failed or Unknown
    retried: str = ""  # why the last retry was made: notRun, unknownOutcome, failure
    callback: InvocationCallback | None = None

    @property
    def done(self) -> bool:
        """Succeeded, Failed or Unknown: it changes no more."""
        return self.state in TERMINAL_STATES

    @property
    def ok(self) -> bool:
        return self.state is InvocationState.Succeeded

    def answer(self) -> InvokeResult | None:
        """The last attempt's answer (what a sync invoke returns), when one ran and parses."""
        if not self.result:
            return None
        try:
            return InvokeResult.model_validate_json(self.result)
        except ValueError:
            return None

    def document(self) -> dict[str, Any]:
        """The status as `krt invocation get -o json` prints it: the result as the JSON object it
        is (the API carries it as text), so that a reader sees its outputs, not an escaped string."""
        doc = self.model_dump(mode="json", exclude_none=True)
        if self.result:
            with contextlib.suppress(ValueError):
                doc["result"] = json.loads(self.result)
        return doc
