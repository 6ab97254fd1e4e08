"""FunctionWorkflow end to end: real dev server, real worker, real runtime host processes. A
Function keeps its replica Runs Ready, rolls a new revision out before the old one goes, scales,
rolls back and is deleted; a Run that only says it is a replica fails; a broken template backs
off and says why."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from kruntimes.api.function import Function, FunctionPhase, FunctionStatus
from kruntimes.api.phases import RunPhase
from kruntimes.api.status import RunStatus
from kruntimes.contracts.function import (
    FUNCTION_LABEL,
    FUNCTION_STATUS_MEMO,
    QUERY_FUNCTION,
    REVISION_LABEL,
    ApplyResult,
    ReplicaOf,
    ScaleInput,
    ScaleResult,
)
from kruntimes.contracts.names import (
    FUNCTION_CONFLICT,
    UPDATE_APPLY,
    UPDATE_DELETE,
    UPDATE_ROLLBACK,
    UPDATE_SCALE,
    run_workflow_id,
)
from kruntimes.contracts.run import RunInput
from kruntimes.sdk.functions import _current_manifest
from kruntimes.temporal.devserver import DevServer
from tests.workflows.conftest import UNLOADABLE, run_manifest, temporal_list
from tests.workflows.functions import (
    function_manifest,
    function_rolled_out,
    function_status,
    replicas_of,
    start_function,
)
from tests.workflows.platform_hosts import address_of, invoke_on_host

REPLICAS = {"runs": 4, "maxHosts": 2}


async def test_a_function_keeps_its_replicas_rolls_out_scales_rolls_back_and_is_deleted(
    platform_factory, dev_server: DevServer
) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(python=REPLICAS) as platform:
        # min < max: autoscaled; the delay keeps the manual scale below as the autoscaler's own
        scale = {"min": 2, "max": 3, "scaleDownDelaySeconds": 600}
        fn = function_manifest("echo", runtime=platform.runtime(), scale=scale, env={"V": "1"})
        handle = await start_function(platform, fn)
        await function_rolled_out(platform, handle, revision=1, ready=2)
        status = await function_status(handle)
        assert status.endpoint is not None
        assert status.endpoint.url == (
            f"https://127.0.0.1:8443/v1/namespaces/default/functions/{fn.metadata.uid}:invoke"
        )
        assert {c.type: c.status.value for c in status.conditions} == {
            "Ready": "True",
            "Progressing": "False",
            "ReplicaFailure": "False",
        }
        first = await replicas_of(handle)
        assert all(r.name.startswith("echo-r1-") for r in first)

        # each replica is a Run with the Function's labels, its uid indexed, Ready on a host
        replica = platform.client.get_workflow_handle(run_workflow_id("default", first[0].name))  # type: ignore[arg-type]
        run_status = await platform.status(replica)
        assert run_status.phase is RunPhase.Ready and run_status.assignedHost
        described = await replica.describe()
        assert described.search_attributes["KrtFunction"] == [fn.metadata.uid]
        assert described.parent_id == handle.id
        listed = temporal_list(dev_server, f"WorkflowType='RunWorkflow' AND KrtFunction='{fn.metadata.uid}'")
        assert sorted(listed) == sorted(run_workflow_id("default", r.name) for r in first)  # type: ignore[arg-type]
        answer = invoke_on_host(
            platform.pki, await address_of(platform, run_status.assignedHost), first[0].runUid
        )
        assert answer.outputs_json

        memo = await (await handle.describe()).memo_value(FUNCTION_STATUS_MEMO, type_hint=FunctionStatus)
        assert memo.phase is FunctionPhase.Ready

        # another uid under the same name is another Function: refused, nothing changes
        other = fn._replace(metadata=fn.metadata._replace(uid=str(uuid.uuid4())))
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(UPDATE_APPLY, other, result_type=ApplyResult)
        assert (
            isinstance(refused.value.cause, ApplicationError)
            and refused.value.cause.type == FUNCTION_CONFLICT
        )

        # only the scale changed: no new revision
        rescaled = fn._replace(spec=fn.spec._replace(scale=fn.spec.scale._replace(max=4)))
        same = await handle.execute_update(UPDATE_APPLY, rescaled, result_type=ApplyResult)
        assert (same.revision, same.changed) == (1, False)

        # a new template: revision 2 comes up, then revision 1's replicas are deleted
        changed = rescaled._replace(spec=rescaled.spec._replace(env={"V": "2"}))
        applied = await handle.execute_update(UPDATE_APPLY, changed, result_type=ApplyResult)
        assert (applied.revision, applied.changed) == (2, True)
        await function_rolled_out(platform, handle, revision=2, ready=2)
        for old in first:
            closed = platform.client.get_workflow_handle(
                run_workflow_id("default", old.name),  # type: ignore[arg-type]
                result_type=RunStatus,
            )
            assert (await closed.result()).phase is RunPhase.Cancelled  # deleted

        # scale within min..max, and refused outside it
        scaled = await handle.execute_update(UPDATE_SCALE, ScaleInput(replicas=3), result_type=ScaleResult)
        assert (scaled.previous, scaled.wanted) == (2, 3)
        await function_rolled_out(platform, handle, revision=2, ready=3)
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update(UPDATE_SCALE, ScaleInput(replicas=5), result_type=ScaleResult)

        # rollback: revision 1's template as revision 3
        back = await handle.execute_update(UPDATE_ROLLBACK, result_type=ApplyResult)
        assert (back.revision, back.changed) == (3, True)
        await function_rolled_out(platform, handle, revision=3, ready=3)
        third = await replicas_of(handle)
        first_run = platform.client.get_workflow_handle(run_workflow_id("default", third[0].name))  # type: ignore[arg-type]
        run_input = await _input_of(first_run)
        assert run_input.run.spec.env == {"V": "1"}
        # its `function` query: the manifest with the rollback's spec and the status, the same
        # Function as the SDK's reading of its history (what a closed workflow falls back to)
        queried = await handle.query(QUERY_FUNCTION, result_type=Function)
        assert queried.spec.env == {"V": "1"} and queried.spec.scale.max == 4
        assert queried.metadata.uid == fn.metadata.uid
        assert queried.status == await function_status(handle)
        assert queried._replace(status=None) == await _current_manifest(
            handle, platform.client.data_converter
        )
        assert run_input.run.metadata.labels == {FUNCTION_LABEL: "echo", REVISION_LABEL: "3"}
        assert run_input.replicaOf == ReplicaOf(
            functionUid=fn.metadata.uid or "", functionName="echo", revision=3
        )

        # delete: every replica goes, then the workflow ends Deleted
        said = await handle.execute_update(UPDATE_DELETE, result_type=str)
        assert said.startswith(f"deleted {handle.id}")
        final = await handle.result()
        assert final.phase is FunctionPhase.Deleted and final.replicas.total == 0
        for r in third:
            gone = platform.client.get_workflow_handle(
                run_workflow_id("default", r.name),  # type: ignore[arg-type]
                result_type=RunStatus,
            )
            assert (await gone.result()).phase is RunPhase.Cancelled


async def _input_of(handle: WorkflowHandle[Any, Any]) -> RunInput:
    async for event in handle.fetch_history_events():
        if event.HasField("workflow_execution_started_event_attributes"):
            payloads = event.workflow_execution_started_event_attributes.input.payloads
            [decoded] = await handle._client.data_converter.decode(payloads, [RunInput])
            assert isinstance(decoded, RunInput)
            return decoded
    raise AssertionError("no start event")


async def test_a_run_that_says_it_is_a_replica_but_was_not_started_by_its_function_fails(
    platform_factory,
) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory() as platform:
        run = run_manifest("impostor", runtime=platform.runtime())
        handle = await platform.client.start_workflow(
            "RunWorkflow",
            RunInput(
                run=run, replicaOf=ReplicaOf(functionUid=str(uuid.uuid4()), functionName="echo", revision=1)
            ),
            id=run_workflow_id(run.metadata.namespace, run.metadata.name),
            task_queue=platform.settings.run_task_queue,
            result_type=RunStatus,
        )
        platform.started.append(handle)
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
        cause = failed.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == "NotStartedByFunction"
        status = await platform.status(handle)
        assert status.phase is RunPhase.Failed and status.assignedHost is None
        assert "started by its Function's workflow (function/default/echo), not by a client" in status.message


async def test_a_broken_template_is_started_again_only_after_a_backoff_and_says_why(platform_factory) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(python=REPLICAS) as platform:
        fn = function_manifest(
            "broken", runtime=platform.runtime(), source=UNLOADABLE, retryPolicy={"limit": 1}
        )
        handle = await start_function(platform, fn)

        backing_off = re.compile(
            r"(\d+) replicas in a row ended before Ready; .*; the next starts in (\d+) s$"
        )

        async def backing_off_after_two() -> bool:
            failure = (await function_status(handle)).condition("ReplicaFailure")
            found = backing_off.search(failure.message) if failure is not None else None
            # the wait doubles with each failure in a row: 1 s after the first, 2 s after the second
            return found is not None and int(found[1]) >= 2 and int(found[2]) == 2 ** (int(found[1]) - 1)

        await platform.eventually(backing_off_after_two, timeout=60, what="a backoff after two failures")
        status = await function_status(handle)
        assert status.phase is FunctionPhase.Pending and status.replicas.ready == 0
        failure = status.condition("ReplicaFailure")
        assert failure is not None and failure.status.value == "True"
        assert "ended Failed before Ready (HandlerLoadFailed" in failure.message, failure.message
        said = await handle.execute_update(UPDATE_DELETE, result_type=str)
        assert said.startswith(f"deleted {handle.id}")


async def test_a_replica_of_a_runtime_without_a_pool_fails_saying_so(platform_factory) -> None:  # type: ignore[no-untyped-def]
    """The Function admits its replicas to their pool itself: a runtime with none rejects the
    replica (RuntimeUnknown), which the Function's ReplicaFailure condition names."""
    async with platform_factory() as platform:
        handle = await start_function(platform, function_manifest("nopool", runtime="absent-runtime"))

        async def rejected() -> bool:
            failure = (await function_status(handle)).condition("ReplicaFailure")
            return failure is not None and "RuntimeUnknown" in failure.message

        await platform.eventually(rejected, timeout=60, what="the replica rejected: RuntimeUnknown")
        said = await handle.execute_update(UPDATE_DELETE, result_type=str)
        assert said.startswith(f"deleted {handle.id}")
