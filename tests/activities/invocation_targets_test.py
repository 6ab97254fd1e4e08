"""invocation_target against the session's real Temporal dev server (#44): Runs are RunWorkflow
executions started with their input and search attributes on a task queue nobody polls (what the
activity reads is their description and first event, not their progress); a Function is a
stand-in FunctionWorkflow answering the `function` query with its manifest."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from kruntimes.activities.invocations import InvocationTargets
from kruntimes.api.function import Function, FunctionPhase
from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.api.spec import Creator
from kruntimes.contracts.function import QUERY_FUNCTION
from kruntimes.contracts.invocation import InvocationPolicy, Retry, Target, TargetKind
from kruntimes.contracts.names import function_workflow_id, run_workflow_id
from kruntimes.contracts.run import RunInput
from kruntimes.temporal.connect import connect
from kruntimes.temporal.devserver import DevServer
from kruntimes.wire import search_typed
from tests.support.waiting import eventually

NOBODY = "invocation-targets-unpolled"
STARTED: list[WorkflowHandle[Any, Any]] = []  # terminated once the module's tests are done
SOURCE = {"main.py": "def handle(x):\n    return x\n"}
BLOCK = {
    "retry": {"onUnknownOutcome": True, "maxAttempts": 7},
    "share": 20,
    "retentionSeconds": 600,
    "callback": {"url": "https://hooks.example.com/in", "secretName": "hook-key"},
}


@pytest.fixture(scope="module")
async def client(dev_server: DevServer) -> AsyncIterator[Client]:
    """The session's dev server; every execution the tests here start is terminated after them
    (other suites list the running RunWorkflows of that server)."""
    client = await connect(dev_server.address, "default")
    yield client
    for handle in STARTED:
        with contextlib.suppress(RPCError):
            await handle.terminate("test over")
    STARTED.clear()


def _namespace() -> str:
    return f"inv-{uuid.uuid4().hex[:6]}"


async def _start_run(
    client: Client, *, phase: RunPhase, namespace: str, block: dict[str, Any] | None = None
) -> Run:
    mode: dict[str, Any] = {"function": {"asyncInvocations": block} if block else {}}
    run = Run.new(
        "echo",
        runtime="python",
        handler="main:handle",
        inline=SOURCE,
        namespace=namespace,
        uid=str(uuid.uuid4()),
        mode=mode,
    )
    run = run._replace(metadata=run.metadata._replace(creator=Creator(kind="cli", subject="bob")))
    pairs = [SearchAttributePair(key, value) for key, value in search_typed.run_values(run, phase=phase)]
    handle = await client.start_workflow(
        "RunWorkflow",
        RunInput(run=run),
        id=run_workflow_id(run.metadata.namespace, run.metadata.name),
        task_queue=NOBODY,
        search_attributes=TypedSearchAttributes(pairs),
    )
    STARTED.append(handle)
    return run


def _target(run: Run, *, named: bool = True) -> Target:
    return Target(
        kind=TargetKind.Run,
        namespace=run.metadata.namespace,
        name=run.metadata.name if named else "",
        uid=run.metadata.uid or "",
        runtime=run.spec.runtime,
    )


async def _read(client: Client, target: Target) -> InvocationPolicy:
    policy: InvocationPolicy = await ActivityEnvironment().run(
        InvocationTargets(client).invocation_target, target
    )
    return policy


async def test_a_ready_run_exists_and_its_policy_is_its_spec(client: Client) -> None:
    run = await _start_run(client, phase=RunPhase.Ready, namespace=_namespace(), block=BLOCK)
    policy = await _read(client, _target(run))
    assert (policy.exists, policy.ready, policy.reason) == (True, True, "")
    assert policy.retry == Retry(onUnknownOutcome=True, maxAttempts=7)
    assert (policy.share, policy.retentionSeconds) == (20, 600)
    assert (policy.callbackUrl, policy.callbackSecretName, policy.creator) == (
        "https://hooks.example.com/in",
        "hook-key",
        "cli:bob",
    )


async def test_a_pending_run_exists_and_is_not_ready(client: Client) -> None:
    run = await _start_run(client, phase=RunPhase.Pending, namespace=_namespace())
    policy = await _read(client, _target(run))
    assert (policy.exists, policy.ready, policy.reason) == (True, False, "the Run is Pending")
    assert policy.retry == Retry() and policy.retentionSeconds == 86_400


async def test_an_ended_run_is_gone_and_keeps_its_retention(client: Client) -> None:
    run = await _start_run(client, phase=RunPhase.Succeeded, namespace=_namespace(), block=BLOCK)
    policy = await _read(client, _target(run))
    assert (policy.exists, policy.reason, policy.retentionSeconds) == (False, "the Run ended Succeeded", 600)
    assert policy.found, "found, and ended: gone at once"


async def test_a_run_whose_workflow_closed_is_gone(client: Client) -> None:
    run = await _start_run(client, phase=RunPhase.Ready, namespace=_namespace())
    await client.get_workflow_handle(run_workflow_id(run.metadata.namespace, "echo")).terminate("test")
    policy = await _read(client, _target(run))
    assert not policy.exists and policy.reason.startswith("the Run ended")


async def test_a_run_is_found_by_its_uid_alone_and_another_uid_under_its_name_is_not_it(
    client: Client,
) -> None:
    run = await _start_run(client, phase=RunPhase.Ready, namespace=_namespace())
    found = await eventually(
        lambda: _read(client, _target(run, named=False)),
        until=lambda p: p.exists,
        what="the Run listed by its uid",
    )
    assert found.ready
    stranger = _target(run)._replace(uid=str(uuid.uuid4()))
    policy = await _read(client, stranger)
    assert (policy.exists, policy.found) == (False, False), "not found: the workflow allows visibility's lag"
    assert policy.reason == f"no Run of uid {stranger.uid} in {run.metadata.namespace}"


async def test_a_target_whose_namespace_is_no_label_is_refused_before_any_query(client: Client) -> None:
    target = Target(kind=TargetKind.Run, namespace="a' OR 'b", uid=str(uuid.uuid4()))
    with pytest.raises(ApplicationError) as raised:
        await _read(client, target)
    assert raised.value.type == "InvalidTarget" and raised.value.non_retryable


@workflow.defn(name="FunctionWorkflow")
class StandInFunction:
    """Answers `function` with the manifest it was started with, until cancelled."""

    @workflow.init
    def __init__(self, fn: Function) -> None:
        self.fn = fn

    @workflow.query(name=QUERY_FUNCTION)
    def function(self) -> Function:
        return self.fn

    @workflow.run
    async def run(self, fn: Function) -> None:
        await workflow.wait_condition(lambda: False)


@pytest.fixture
async def functions(client: Client) -> AsyncIterator[str]:
    queue = f"invocation-functions-{uuid.uuid4().hex[:6]}"
    async with Worker(
        client, task_queue=queue, workflows=[StandInFunction], workflow_runner=UnsandboxedWorkflowRunner()
    ):
        yield queue


async def _start_function(client: Client, queue: str, *, phase: FunctionPhase) -> Function:
    namespace = _namespace()
    fn = Function.new(
        "hello",
        runtime="python",
        handler="main:handle",
        inline=SOURCE,
        namespace=namespace,
        uid=str(uuid.uuid4()),
        mode={"function": {"asyncInvocations": BLOCK}},
    )
    pairs = [SearchAttributePair(key, value) for key, value in search_typed.function_values(fn, phase=phase)]
    handle = await client.start_workflow(
        StandInFunction.run,
        fn,
        id=function_workflow_id(fn.metadata.namespace, fn.metadata.name),
        task_queue=queue,
        search_attributes=TypedSearchAttributes(pairs),
    )
    STARTED.append(handle)
    return fn


def _function_target(fn: Function) -> Target:
    return Target(
        kind=TargetKind.Function,
        namespace=fn.metadata.namespace,
        name=fn.metadata.name,
        uid=fn.metadata.uid or "",
    )


async def test_a_function_that_exists_keeps_its_invocations_with_its_current_spec(
    client: Client, functions: str
) -> None:
    fn = await _start_function(client, functions, phase=FunctionPhase.Degraded)
    policy = await _read(client, _function_target(fn))
    assert (policy.exists, policy.ready, policy.share, policy.retentionSeconds) == (True, True, 20, 600)
    assert policy.retry.maxAttempts == 7 and policy.callbackSecretName == "hook-key"


async def test_a_function_being_deleted_is_gone(client: Client, functions: str) -> None:
    fn = await _start_function(client, functions, phase=FunctionPhase.Deleting)
    policy = await _read(client, _function_target(fn))
    assert (policy.exists, policy.reason) == (False, "the Function is Deleting")
