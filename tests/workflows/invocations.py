"""Stand-ins for InvocationWorkflow's activities (registered under their names, scripted per
invocation id), the time-skipping server they run against, and how a test starts an invocation:
shared by tests/workflows/invocation_test.py and tests/replay/record_invocations.py."""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from kruntimes.contracts.invocation import (
    ACTIVITY_ATTEMPT,
    ACTIVITY_CALLBACK,
    ACTIVITY_TARGET,
    AttemptOutcome,
    AttemptRequest,
    CallbackOutcome,
    CallbackRequest,
    InvocationInput,
    InvocationPolicy,
    InvocationStatus,
    Retry,
    Target,
    TargetKind,
    invocation_workflow_id,
)
from kruntimes.temporal.connect import DATA_CONVERTER
from kruntimes.temporal.devserver import SEARCH_ATTRIBUTES
from kruntimes.wire import invocation_summaries, search_typed
from kruntimes.workflows.invocation import InvocationWorkflow

TEST_SERVER_STARTUP = timedelta(seconds=60)
BODY = '{"n": 1}'
DIGEST = "0" * 64
T0 = datetime(2026, 1, 1, tzinfo=UTC)

Step = Any  # a scripted answer, or an Exception to raise


def answered(status: str = "Succeeded", **extra: object) -> AttemptOutcome:
    import json

    body = json.dumps({"invocationId": "i", "status": status, "outputs": {"ok": True}, **extra})
    return AttemptOutcome(httpStatus=200, body=body, dispatched=True)


def refused(http: int, reason: str = "", *, dispatched: bool = False) -> AttemptOutcome:
    return AttemptOutcome(httpStatus=http, reason=reason, dispatched=dispatched)


def ready(**policy: Any) -> InvocationPolicy:
    retry = policy.pop("retry", {})
    return InvocationPolicy(exists=True, ready=True, retry=Retry.model_validate(retry), **policy)


GONE = InvocationPolicy(exists=False, reason="the Run ended Succeeded")
NOT_READY = InvocationPolicy(exists=True, ready=False, reason="the Run is Pending")


@dataclass
class Script:
    """What each stand-in answers, in order (the last one repeated), and what each was asked."""

    targets: list[Step] = field(default_factory=lambda: [ready()])
    attempts: list[Step] = field(default_factory=lambda: [answered()])
    callbacks: list[Step] = field(default_factory=lambda: [CallbackOutcome(delivered=True, httpStatus=200)])
    asked_targets: list[Target] = field(default_factory=list)
    asked_attempts: list[AttemptRequest] = field(default_factory=list)
    asked_callbacks: list[CallbackRequest] = field(default_factory=list)


def _next(steps: list[Step], n: int) -> Any:
    step = steps[min(n, len(steps) - 1)]
    if isinstance(step, BaseException):
        raise step
    return step


class StandIns:
    """The three activities, scripted by invocation id (the target's uid for the target read)."""

    def __init__(self) -> None:
        self.scripts: dict[str, Script] = {}

    def script(self, key: str) -> Script:
        return self.scripts.setdefault(key, Script())

    @activity.defn(name=ACTIVITY_TARGET)
    async def invocation_target(self, target: Target) -> InvocationPolicy:
        script = self.script(target.uid)
        script.asked_targets.append(target)
        return _next(script.targets, len(script.asked_targets) - 1)  # type: ignore[no-any-return]

    @activity.defn(name=ACTIVITY_ATTEMPT)
    async def attempt_invocation(self, request: AttemptRequest) -> AttemptOutcome:
        script = self.script(request.target.uid)
        script.asked_attempts.append(request)
        return _next(script.attempts, len(script.asked_attempts) - 1)  # type: ignore[no-any-return]

    @activity.defn(name=ACTIVITY_CALLBACK)
    async def deliver_callback(self, request: CallbackRequest) -> CallbackOutcome:
        script = self.script(request.status.target.uid)
        script.asked_callbacks.append(request)
        return _next(script.callbacks, len(script.asked_callbacks) - 1)  # type: ignore[no-any-return]

    def activities(self) -> list[Callable[..., Any]]:
        return [self.invocation_target, self.attempt_invocation, self.deliver_callback]


def not_allowed() -> ApplicationError:
    return ApplicationError(
        "the creator may not use Secret hook-key", type="SecretNotAllowed", non_retryable=True
    )


@asynccontextmanager
async def time_skipping() -> AsyncIterator[WorkflowEnvironment]:
    server = Path(sys.executable).with_name("temporal-test-server")
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=DATA_CONVERTER,
        test_server_existing_path=str(server),
        test_server_startup_timeout=TEST_SERVER_STARTUP,
    )
    await env.client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace="default",
            search_attributes={
                name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for name in SEARCH_ATTRIBUTES
            },
        )
    )
    try:
        yield env
    finally:
        await env.shutdown()


@asynccontextmanager
async def invocation_worker(client: Client, standins: StandIns) -> AsyncIterator[str]:
    """A worker of InvocationWorkflow with the stand-ins, on a task queue of its own."""
    queue = f"invocations-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client, task_queue=queue, workflows=[InvocationWorkflow], activities=standins.activities()
    ):
        yield queue


def new_input(
    *, kind: TargetKind = TargetKind.Run, callback: str | None = None, invocation_id: str | None = None
) -> InvocationInput:
    target = Target(
        kind=kind,
        namespace="demo",
        name="echo",
        uid=str(uuid.uuid4()),
        runtime="python" if kind is TargetKind.Run else "",
    )
    return InvocationInput(
        target=target,
        invocationId=invocation_id or f"inv-{uuid.uuid4().hex[:6]}",
        bodySha256=DIGEST,
        body=BODY,
        acceptedAt=T0,
        caller="cli:alice",
        callbackUrl=callback,
    )


async def start(
    client: Client, queue: str, input: InvocationInput, *, as_gateway: bool = True
) -> WorkflowHandle[Any, InvocationStatus]:
    """Start as the gateway does (search attributes and summary set), or bare (`as_gateway`
    False: as a plain client would)."""
    target = input.target
    extra: dict[str, Any] = {}
    if as_gateway:
        extra["search_attributes"] = search_typed.invocation_at_start(
            namespace=target.namespace,
            target_kind=target.kind.value,
            target_uid=target.uid,
            runtime=target.runtime,
        )
        extra["static_summary"] = invocation_summaries.invocation_summary(
            kind=target.kind.value,
            namespace=target.namespace,
            name=target.name,
            uid=target.uid,
            invocation_id=input.invocationId,
        )
        extra["memo"] = {"krtDigest": input.bodySha256}
    return await client.start_workflow(
        InvocationWorkflow.run,
        input,
        id=invocation_workflow_id(target.namespace, target.uid, input.invocationId),
        task_queue=queue,
        result_type=InvocationStatus,
        **extra,
    )
