"""kruntimes.activities.runtime_host.RuntimeHostActivities in an ActivityEnvironment, against a real Runtime
Server and against a scripted FunctionRuntime server: what each activity sends, what it returns,
and how a gRPC failure becomes an ApplicationError (type the host's krt-reason, retryable exactly
for transport trouble, nothing of the request in the message)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.failure.v1 import Failure
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from kruntimes.activities.runtime_host import RuntimeHostActivities
from kruntimes.contracts.hostcalls import CancelTaskInput, FunctionState, StatusInput, UnregisterInput
from kruntimes.pki.assignments import SignedAssignment
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.temporal.connect import DATA_CONVERTER
from kruntimes.temporal.devserver import free_port
from tests.activities.conftest import (
    Abort,
    RealHost,
    Scripted,
    function_run,
    register_input,
    task_input,
    task_run,
)
from tests.support.pki import TestPKI
from tests.support.waiting import eventually

RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
FAILURES = [c for c in grpc.StatusCode if c is not grpc.StatusCode.OK]
SECRET = "s3cr3t-token-value"


@pytest.fixture
async def hosts(pki: TestPKI) -> AsyncIterator[RuntimeHostActivities]:
    activities = RuntimeHostActivities(signer=pki.signer)
    try:
        yield activities
    finally:
        await activities.close()


async def _failure(run: Callable[[], Any]) -> ApplicationError:
    with pytest.raises(ApplicationError) as caught:
        await run()
    return caught.value


# --- a real Runtime Server ------------------------------------------------------------------------


async def test_a_function_registers_reports_its_status_and_unregisters(
    hosts: RuntimeHostActivities, real_host: RealHost
) -> None:
    env = ActivityEnvironment()
    request = register_input(
        real_host.address, function_run(), host_id=real_host.host_id, host_uid=real_host.host_uid
    )
    registered = await env.run(hosts.register_function, request)
    assert registered.created and registered.registrationId
    assert registered.hostUid == real_host.host_uid
    again = await env.run(hosts.register_function, request)
    assert (again.registrationId, again.created) == (registered.registrationId, False), "idempotent"

    status = StatusInput(address=real_host.address, registrationId=registered.registrationId)
    state = await env.run(hosts.function_status, status)
    assert (state.registered, state.ready, state.inFlight, state.fatalError) == (True, True, 0, "")
    assert state.hostUid == real_host.host_uid
    assert state.lastActivity is not None and state.lastActivity.tzinfo is not None

    unregister = UnregisterInput(address=real_host.address, registrationId=registered.registrationId)
    assert await env.run(hosts.unregister_function, unregister) is True
    gone = await env.run(hosts.function_status, status)
    assert (gone.registered, gone.lastActivity) == (False, None)
    assert await env.run(hosts.unregister_function, unregister) is False, "absent: nothing to do"


async def _host_status(pki: TestPKI, host: RealHost, registration_id: str) -> pb.FunctionStatusResponse:
    """FunctionStatus as the host answers it (what the activity keeps of it is less)."""
    channel = pki.aio_channel(host.address, as_=pki.control_plane)
    try:
        stub = pb_grpc.FunctionRuntimeStub(channel)
        answer: pb.FunctionStatusResponse = await stub.FunctionStatus(
            pb.FunctionStatusRequest(registration_id=registration_id)
        )
        return answer
    finally:
        await channel.close()


async def test_a_runs_concurrency_and_queue_reach_its_host_with_its_registration(
    hosts: RuntimeHostActivities, real_host: RealHost, pki: TestPKI
) -> None:
    env = ActivityEnvironment()
    run = function_run(mode={"function": {"concurrency": 3, "queue": 5, "queueTimeoutSeconds": 2.5}})
    request = register_input(real_host.address, run, host_id=real_host.host_id, host_uid=real_host.host_uid)
    registered = await env.run(hosts.register_function, request)
    status = StatusInput(address=real_host.address, registrationId=registered.registrationId)
    state = await env.run(hosts.function_status, status)
    assert (state.inFlight, state.waiting) == (0, 0)
    answer = await _host_status(pki, real_host, registered.registrationId)
    assert (answer.concurrency, answer.queue) == (3, 5)
    unset = register_input(
        real_host.address, function_run(), host_id=real_host.host_id, host_uid=real_host.host_uid
    )
    plain = await _host_status(pki, real_host, (await env.run(hosts.register_function, unset)).registrationId)
    assert (plain.concurrency, plain.queue) == (1, 0), "a Run that names none takes one at a time"


async def test_a_task_runs_to_its_outputs(hosts: RuntimeHostActivities, real_host: RealHost) -> None:
    run = task_run("def run(p):\n    return {'answer': 42}\n")
    result = await ActivityEnvironment().run(hosts.execute_task, task_input(real_host.address, run))
    assert (result.status, result.outputs, result.message) == ("Succeeded", {"answer": 42}, "")


async def test_a_failing_task_reports_failed_with_the_handlers_error(
    hosts: RuntimeHostActivities, real_host: RealHost
) -> None:
    run = task_run("def run(p):\n    raise ValueError('boom')\n")
    result = await ActivityEnvironment().run(hosts.execute_task, task_input(real_host.address, run))
    assert result.status == "Failed" and "ValueError: boom" in result.message


async def test_cancelling_a_task_the_host_does_not_run_is_no_error(
    hosts: RuntimeHostActivities, real_host: RealHost
) -> None:
    cancel = CancelTaskInput(address=real_host.address, runUid=str(uuid.uuid4()), attempt=1)
    assert await ActivityEnvironment().run(hosts.cancel_task, cancel) is False


async def test_a_handler_that_cannot_load_is_a_non_retryable_error_typed_by_the_hosts_reason(
    hosts: RuntimeHostActivities, real_host: RealHost
) -> None:
    request = register_input(
        real_host.address,
        function_run("import nowhere_to_be_found\n"),
        host_id=real_host.host_id,
        host_uid=real_host.host_uid,
    )
    err = await _failure(lambda: ActivityEnvironment().run(hosts.register_function, request))
    assert (err.type, err.non_retryable) == ("HandlerLoadFailed", True)
    assert err.message.startswith(f"runtime host {real_host.address}: ")
    assert "nowhere_to_be_found" in err.message


async def test_the_runs_environment_never_reaches_the_error_or_its_history_record(
    hosts: RuntimeHostActivities, real_host: RealHost
) -> None:
    """The env holds the function's secrets: the failure Temporal records (message, cause chain,
    stack trace) carries none of it."""
    source = "import os\nassert os.environ['API_TOKEN']\nraise RuntimeError('no luck')\n"
    run = function_run(source, env={"API_TOKEN": SECRET})
    request = register_input(real_host.address, run, host_id=real_host.host_id, host_uid=real_host.host_uid)
    err = await _failure(lambda: ActivityEnvironment().run(hosts.register_function, request))
    assert err.type == "HandlerLoadFailed"
    recorded = Failure()
    await DATA_CONVERTER.encode_failure(err, recorded)
    assert SECRET.encode() not in recorded.SerializeToString()
    assert SECRET not in str(err)


# --- the gRPC error → ApplicationError mapping (a scripted server) --------------------------------


@pytest.mark.parametrize("reason", ["HostSaysWhy", None], ids=["krt-reason", "no-trailer"])
@pytest.mark.parametrize("code", FAILURES, ids=[c.name for c in FAILURES])
async def test_a_status_becomes_an_application_error_typed_by_the_reason_and_retryable_for_transport(
    hosts: RuntimeHostActivities, scripted: Scripted, code: grpc.StatusCode, reason: str | None
) -> None:
    scripted.runtime.script("RegisterFunction", Abort(code, "it said no", reason))
    request = register_input(scripted.address, function_run())
    err = await _failure(lambda: ActivityEnvironment().run(hosts.register_function, request))
    if reason is not None:
        assert err.type == reason
    else:
        assert err.type == ("HostUnavailable" if code in RETRYABLE else code.name)
    assert err.non_retryable is (code not in RETRYABLE)
    assert err.message == f"runtime host {scripted.address}: it said no"
    assert isinstance(err.__cause__, grpc.aio.AioRpcError), "the library error is the cause"


@pytest.mark.parametrize(
    ("method", "activity", "request_to"),
    [
        ("FunctionStatus", "function_status", lambda a: StatusInput(address=a, registrationId="r")),
        (
            "UnregisterFunction",
            "unregister_function",
            lambda a: UnregisterInput(address=a, registrationId="r"),
        ),
        ("ExecuteTask", "execute_task", lambda a: task_input(a, task_run("def run(p):\n    return {}\n"))),
        ("CancelTask", "cancel_task", lambda a: CancelTaskInput(address=a, runUid="u", attempt=1)),
    ],
    ids=["function_status", "unregister_function", "execute_task", "cancel_task"],
)
@pytest.mark.parametrize(
    ("code", "retryable"),
    [(grpc.StatusCode.UNAVAILABLE, True), (grpc.StatusCode.FAILED_PRECONDITION, False)],
    ids=["UNAVAILABLE", "FAILED_PRECONDITION"],
)
async def test_every_activity_maps_failures_the_same_way(
    hosts: RuntimeHostActivities,
    scripted: Scripted,
    method: str,
    activity: str,
    request_to: Callable[[str], Any],
    code: grpc.StatusCode,
    retryable: bool,
) -> None:
    scripted.runtime.script(method, Abort(code, "no", "TheReason"))
    run_activity = getattr(hosts, activity)
    err = await _failure(lambda: ActivityEnvironment().run(run_activity, request_to(scripted.address)))
    assert (err.type, err.non_retryable, err.message) == (
        "TheReason",
        not retryable,
        f"runtime host {scripted.address}: no",
    )


async def test_a_status_without_details_is_described_by_its_code(
    hosts: RuntimeHostActivities, scripted: Scripted
) -> None:
    scripted.runtime.script("CancelTask", Abort(grpc.StatusCode.NOT_FOUND))
    cancel = CancelTaskInput(address=scripted.address, runUid="u", attempt=1)
    err = await _failure(lambda: ActivityEnvironment().run(hosts.cancel_task, cancel))
    assert (err.type, err.message) == ("NOT_FOUND", f"runtime host {scripted.address}: NOT_FOUND")


async def test_a_host_nobody_answers_at_is_a_retryable_host_unavailable(hosts: RuntimeHostActivities) -> None:
    address = f"127.0.0.1:{free_port()}"  # picked free: nothing listens there
    status = StatusInput(address=address, registrationId="r")
    err = await _failure(lambda: ActivityEnvironment().run(hosts.function_status, status))
    assert (err.type, err.non_retryable) == ("HostUnavailable", False)
    assert err.message.startswith(f"runtime host {address}: ")


# --- what is sent and what comes back (a scripted server) -----------------------------------------


async def test_registration_sends_the_runs_identity_config_and_signed_assignment(
    hosts: RuntimeHostActivities, scripted: Scripted, pki: TestPKI
) -> None:
    run = function_run(env={"GREETING": "hi"})
    request = register_input(scripted.address, run, attempt=3)
    result = await ActivityEnvironment().run(hosts.register_function, request)
    assert (result.registrationId, result.hostUid, result.created) == ("reg-1", "uid-1", False)
    [sent] = scripted.runtime.calls["RegisterFunction"].requests
    assert (sent.run.run_uid, sent.run.attempt, sent.run.name, sent.run.runtime) == (
        run.metadata.uid,
        3,
        run.metadata.name,
        "python",
    )
    assert (sent.config.adapter, sent.config.handler, dict(sent.config.env)) == (
        "python",
        "main:handle",
        {"GREETING": "hi"},
    )
    assert [(f.name, f.content) for f in sent.config.inline.files] == [
        ("main.py", b"def handle(p):\n    return p\n")
    ]
    # with the signed assignment of this attempt to the assigned host
    assigned = pki.verifier().verify(sent.assignment)
    assert assigned == SignedAssignment(
        run_uid=run.metadata.uid,
        attempt=3,
        host_id="scripted-0",
        host_uid="uid-1",
        namespace="default",
        name=run.metadata.name,
        runtime="python",
    )


async def test_a_registration_reaches_only_the_assigned_host(
    hosts: RuntimeHostActivities, real_host: RealHost
) -> None:
    """The channel for a registration verifies the server's certificate names the assigned host:
    a host at the address that is another one (here: the assignment names another id) gets
    nothing, and the failure is a retryable transport error, not a decision of a host."""
    request = register_input(real_host.address, function_run(), host_id="act-9", host_uid=real_host.host_uid)
    err = await _failure(lambda: ActivityEnvironment().run(hosts.register_function, request))
    assert (err.type, err.non_retryable) == ("HostUnavailable", False)


async def test_an_assignment_that_cannot_be_signed_is_a_permanent_failure(
    hosts: RuntimeHostActivities, real_host: RealHost
) -> None:
    request = register_input(real_host.address, function_run(), host_id="act-0", host_uid="../x")
    err = await _failure(lambda: ActivityEnvironment().run(hosts.register_function, request))
    assert (err.type, err.non_retryable) == ("AssignmentInvalid", True)


async def test_the_status_of_a_held_registration_carries_its_idle_clock(
    hosts: RuntimeHostActivities, scripted: Scripted
) -> None:
    last = Timestamp()
    last.FromDatetime(datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC))
    scripted.runtime.script(
        "FunctionStatus",
        pb.FunctionStatusResponse(registered=True, ready=True, in_flight=1, last_activity=last, host_uid="u"),
    )
    status = StatusInput(address=scripted.address, registrationId="reg-1")
    state = await ActivityEnvironment().run(hosts.function_status, status)
    assert state == FunctionState(
        registered=True,
        ready=True,
        inFlight=1,
        lastActivity=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
        hostUid="u",
    )
    [sent] = scripted.runtime.calls["FunctionStatus"].requests
    assert sent.registration_id == "reg-1"


async def test_a_registration_the_host_does_not_hold_has_no_last_activity(
    hosts: RuntimeHostActivities, scripted: Scripted
) -> None:
    last = Timestamp()
    last.FromDatetime(datetime(2025, 1, 2, tzinfo=UTC))
    scripted.runtime.script("FunctionStatus", pb.FunctionStatusResponse(registered=False, last_activity=last))
    status = StatusInput(address=scripted.address, registrationId="reg-1")
    state = await ActivityEnvironment().run(hosts.function_status, status)
    assert (state.registered, state.lastActivity) == (False, None)


async def test_unregistering_sends_the_grace_in_milliseconds(
    hosts: RuntimeHostActivities, scripted: Scripted
) -> None:
    unregister = UnregisterInput(address=scripted.address, registrationId="reg-1", graceSeconds=2.5)
    assert await ActivityEnvironment().run(hosts.unregister_function, unregister) is True
    [sent] = scripted.runtime.calls["UnregisterFunction"].requests
    assert (sent.registration_id, sent.grace_ms) == ("reg-1", 2500)


@pytest.mark.parametrize(
    ("answer", "status", "message"),
    [
        (pb.ExecuteTaskResponse(status=pb.TASK_STATUS_SUCCEEDED, outputs_json=b'{"k": 1}'), "Succeeded", ""),
        (
            pb.ExecuteTaskResponse(
                status=pb.TASK_STATUS_FAILED,
                exit_code=3,
                error=pb.InvocationError(type="HandlerError", message="it broke"),
            ),
            "Failed",
            "it broke",
        ),
        (pb.ExecuteTaskResponse(status=pb.TASK_STATUS_TIMED_OUT), "Timeout", ""),
        (pb.ExecuteTaskResponse(status=pb.TASK_STATUS_CANCELLED), "Cancelled", ""),
        (pb.ExecuteTaskResponse(status=pb.TASK_STATUS_UNSPECIFIED), "Failed", ""),
    ],
    ids=["succeeded", "failed", "timed-out", "cancelled", "unspecified"],
)
async def test_a_tasks_answer_becomes_its_result(
    hosts: RuntimeHostActivities,
    scripted: Scripted,
    answer: pb.ExecuteTaskResponse,
    status: str,
    message: str,
) -> None:
    scripted.runtime.script("ExecuteTask", answer)
    run = task_run("def run(p):\n    return {}\n")
    result = await ActivityEnvironment().run(
        hosts.execute_task, task_input(scripted.address, run, timeout_s=7)
    )
    assert (result.status, result.exitCode, result.message) == (status, answer.exit_code, message)
    assert result.outputs == ({"k": 1} if answer.outputs_json else None)
    [sent] = scripted.runtime.calls["ExecuteTask"].requests
    assert (sent.run.run_uid, sent.timeout_ms, sent.input) == (run.metadata.uid, 7000, b"null")


# --- heartbeats and cancellation ------------------------------------------------------------------


async def test_a_slow_registration_heartbeats_until_the_host_answers(
    hosts: RuntimeHostActivities, scripted: Scripted
) -> None:
    held = scripted.runtime.script(
        "RegisterFunction", pb.RegisterFunctionResponse(registration_id="reg-1", created=True), hold=True
    )
    assert held.release is not None
    beats: list[tuple[Any, ...]] = []
    env = ActivityEnvironment()

    def on_heartbeat(*details: Any) -> None:
        beats.append(details)
        held.release.set()  # type: ignore[union-attr]  # the host answers once a heartbeat went out

    env.on_heartbeat = on_heartbeat
    result = await env.run(hosts.register_function, register_input(scripted.address, function_run()))
    assert result.registrationId == "reg-1"
    assert beats, "the activity heartbeated while the host was registering"


async def test_a_running_task_heartbeats_and_cancelling_it_cancels_the_task_on_the_host(
    hosts: RuntimeHostActivities, scripted: Scripted
) -> None:
    running = scripted.runtime.script("ExecuteTask", pb.ExecuteTaskResponse(), hold=True)
    beat = asyncio.Event()
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beat.set()
    run = task_run("def run(p):\n    return {}\n")
    activity = asyncio.ensure_future(env.run(hosts.execute_task, task_input(scripted.address, run)))
    await asyncio.wait_for(running.started.wait(), 30)
    await asyncio.wait_for(beat.wait(), 30)
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await activity
    [cancel] = scripted.runtime.calls["CancelTask"].requests
    assert (cancel.run_uid, cancel.attempt) == (run.metadata.uid, 1)
    await eventually(lambda: running.cancelled, within=30, every=0.01, what="the task cancelled on the host")
