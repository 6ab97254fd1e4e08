"""RunWorkflow end to end: real dev server, real worker, real runtime host processes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError

from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.api.status import ConditionType, RunStatus
from kruntimes.contracts.names import SIGNAL_CANCEL, SIGNAL_REJECTED, UPDATE_DELETE
from kruntimes.temporal.devserver import DevServer
from tests.workflows.conftest import EXITS_LOADING, UNLOADABLE, Platform, run_manifest, temporal_list
from tests.workflows.platform_hosts import (
    address_of,
    invoke_on_host,
    ready_elsewhere,
    ready_on_host,
    registrations,
)

ONE_SLOT = {"runs": 1, "maxHosts": 1}  # one host of one slot


@pytest.mark.parametrize("by_sdk", [False, True], ids=["run-admits", "starter-admits"])
async def test_a_function_run_becomes_ready_and_answers_on_its_host(
    platform_factory, dev_server: DevServer, by_sdk: bool
) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory() as platform:
        run = run_manifest("hello", runtime=platform.runtime())
        handle = await platform.start(run, by_sdk=by_sdk)
        status = await platform.wait_phase(handle, RunPhase.Ready)
        assert status.attempt == 1
        assert status.assignedHost and status.assignedHostUID and status.startTime
        ready = status.condition(ConditionType.Ready)
        assert ready is not None and ready.status == "True" and ready.reason == "FunctionRegistered"
        assert status.endpoint is not None
        assert status.endpoint.url == (
            f"https://127.0.0.1:8443/v1/namespaces/default/runtimes/{platform.runtime()}/functions/{run.metadata.uid}:invoke"
        )
        address = await address_of(platform, status.assignedHost)
        answer = invoke_on_host(platform.pki, address, run.metadata.uid, b'{"hi": 1}')  # type: ignore[arg-type]
        assert json.loads(answer.outputs_json)["echo"] == {"hi": 1}

        async def listed() -> bool:
            found = temporal_list(dev_server, f"KrtPhase='Ready' AND KrtRunUid='{run.metadata.uid}'")
            return found == [handle.id]

        await platform.eventually(listed, what="the Run in `temporal workflow list --query KrtPhase='Ready'`")
        metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        assert metadata.current_details.startswith("**Ready**"), "the UI shows the phase in words"
        description = await handle.describe()
        attrs = description.search_attributes
        assert attrs["KrtRuntime"] == [platform.runtime()] and attrs["KrtMode"] == ["function"]
        assert attrs["KrtNamespace"] == ["default"]


async def test_cancel_before_assignment_ends_cancelled_without_touching_a_host(platform_factory) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(python=ONE_SLOT) as platform:
        _, waiting = await _one_ready_one_queued(platform, "holder", "waiter")
        await waiting.signal(SIGNAL_CANCEL)
        await waiting.signal(SIGNAL_CANCEL)  # idempotent
        status = await platform.wait_phase(waiting, RunPhase.Cancelled)
        assert status.assignedHost is None and status.attempt == 0
        await platform.eventually(lambda: _queued(platform, 0), what="the queue emptied")


async def _queued(platform: Platform, n: int) -> bool:
    return len((await platform.pool()).queue) == n


async def _one_ready_one_queued(
    platform: Platform, first: str, second: str
) -> tuple[WorkflowHandle[Any, RunStatus], WorkflowHandle[Any, RunStatus]]:
    """On a platform of ONE_SLOT: Run `first` Ready in the slot, Run `second` queued behind it."""
    holder = await platform.start(run_manifest(first, runtime=platform.runtime()))
    await platform.wait_phase(holder, RunPhase.Ready)
    queued = await platform.start(run_manifest(second, runtime=platform.runtime()))
    await platform.eventually(lambda: _queued(platform, 1), what="the second Run queued")
    assert (await platform.status(queued)).phase is RunPhase.Pending
    return holder, queued


async def _slot_released(platform: Platform) -> None:
    async def released() -> bool:
        return not (await platform.pool()).reservations

    await platform.eventually(released, what="the slot released")


async def _unregistered_and_released(platform: Platform, run: Run, address: str) -> None:
    """The Run's registration is gone from the host at `address`, and its slot is released."""
    assert run.metadata.uid not in registrations(platform.pki, address)
    await _slot_released(platform)


async def test_cancel_when_ready_unregisters_and_frees_the_slot(platform_factory) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory() as platform:
        run = run_manifest("to-cancel", runtime=platform.runtime())
        handle, _, address = await ready_on_host(platform, run)
        assert run.metadata.uid in registrations(platform.pki, address)
        await handle.signal(SIGNAL_CANCEL)
        final = await platform.wait_phase(handle, RunPhase.Cancelled)
        assert final.endpoint is None and final.completionTime is not None
        await _unregistered_and_released(platform, run, address)


async def test_delete_when_ready_runs_cleanup_and_closes_the_workflow(platform_factory) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory() as platform:
        run = run_manifest("to-delete", runtime=platform.runtime())
        handle, _, address = await ready_on_host(platform, run)
        workspaces = list((platform.state_dir / "work").rglob(f"{run.metadata.uid}.*"))
        assert workspaces, "the registration has a workspace on the host"
        answer = await handle.execute_update(UPDATE_DELETE, result_type=str)
        assert answer == f"deleted {handle.id}: Cancelled"  # one plain line: the `temporal` CLI prints it
        result = await handle.result()  # the workflow closed
        assert result.phase is RunPhase.Cancelled
        assert not any(p.exists() for p in workspaces)
        await _unregistered_and_released(platform, run, address)


async def test_a_handler_whose_process_exits_loading_is_retried_up_to_the_limit_then_fails(
    platform_factory,
) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory() as platform:
        run = run_manifest(
            "bad",
            runtime=platform.runtime(),
            source=EXITS_LOADING,
            retryPolicy={"limit": 3, "backoffSeconds": 0.1, "maxBackoffSeconds": 0.2},
        )
        handle = await platform.start(run)
        status = await platform.wait_phase(handle, RunPhase.Failed)
        assert status.attempt == 3
        ready = status.condition(ConditionType.Ready)
        assert ready is not None and ready.reason == "RetriesExhausted"
        assert status.message.startswith(
            "attempt 3: HandlerLoadInterrupted: function process exited while loading"
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
        assert isinstance(failed.value.cause, ApplicationError)
        assert failed.value.cause.type == "RetriesExhausted"
        assert (
            failed.value.cause.message
            == f"RetriesExhausted: HandlerLoadInterrupted (ProcessExited) on {status.assignedHost} after 3 attempts"
        )
        await _slot_released(platform)


async def test_a_handler_that_cannot_be_imported_fails_at_the_first_attempt(platform_factory) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory() as platform:
        run = run_manifest("unloadable", runtime=platform.runtime(), source=UNLOADABLE)
        handle = await platform.start(run)
        status = await platform.wait_phase(handle, RunPhase.Failed)
        assert status.attempt == 1
        ready = status.condition(ConditionType.Ready)
        assert ready is not None and ready.reason == "HandlerLoadFailed"
        assert (
            status.message == "cannot import 'main': No module named 'nowhere_to_be_found' (main.py, line 1)"
        )
        await _slot_released(platform)


async def test_with_one_slot_a_second_run_waits_pending_until_the_first_ends(platform_factory) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(python=ONE_SLOT) as platform:
        first, second = await _one_ready_one_queued(platform, "first", "second")
        await first.signal(SIGNAL_CANCEL)
        await platform.wait_phase(first, RunPhase.Cancelled)
        status = await platform.wait_phase(second, RunPhase.Ready)
        assert len((await platform.pool()).hosts) == 1
        assert status.assignedHost == (await platform.status(first)).assignedHost


@pytest.mark.parametrize(
    ("source", "timeout", "phase", "check"),
    [
        ("def run(p):\n    return {'answer': 42}\n", None, RunPhase.Succeeded, {"answer": 42}),
        ("def run(p):\n    raise ValueError('boom')\n", None, RunPhase.Failed, "ValueError: boom"),
        ("import time\ndef run(p):\n    time.sleep(60)\n", 2, RunPhase.Timeout, None),
    ],
)
async def test_task_mode_outcomes(
    platform_factory, source: str, timeout: int | None, phase: RunPhase, check: Any
) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory() as platform:
        extra = {"timeoutSeconds": timeout} if timeout else {}
        run = run_manifest(
            "task", runtime=platform.runtime(), source=source, handler="main:run", mode={"task": {}}, **extra
        )
        handle = await platform.start(run)
        status = await platform.wait_phase(handle, phase)
        if isinstance(check, dict):
            assert status.outputs == check
        elif isinstance(check, str):
            assert check in status.message
        await _slot_released(platform)


async def test_task_outputs_are_bounded(platform_factory) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory() as platform:
        run = run_manifest(
            "big-task",
            runtime=platform.runtime(),
            source="def run(p):\n    return {'k': 'x' * 100000}\n",
            handler="main:run",
            mode={"task": {}},
        )
        status = await platform.wait_phase(await platform.start(run), RunPhase.Failed)
        assert "ValueTooLarge" in status.message


async def test_fifty_runs_on_five_hosts_are_all_ready_and_no_slot_is_double_booked(platform_factory) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(python={"runs": 10, "minHosts": 5, "maxHosts": 5}) as platform:
        await platform.eventually(lambda: _hosts(platform, 5), timeout=60, what="five warm hosts")
        handles = await asyncio.gather(
            *(  # half as plain Temporal starts them, half as the SDK does (the starter admits)
                platform.start(run_manifest(f"burst-{i}", runtime=platform.runtime()), by_sdk=i % 2 == 0)
                for i in range(50)
            )
        )
        statuses = await asyncio.gather(
            *(platform.wait_phase(h, RunPhase.Ready, timeout=120) for h in handles)
        )
        per_host: dict[str, int] = {}
        for status in statuses:
            per_host[status.assignedHost] = per_host.get(status.assignedHost, 0) + 1  # type: ignore[index]
        assert sum(per_host.values()) == 50 and max(per_host.values()) <= 10
        pool = await platform.pool()
        assert len(pool.reservations) == 50
        assert len({r.runUid for r in pool.reservations}) == 50
        for host in pool.hosts:
            assert host.address is not None
            assert len(registrations(platform.pki, host.address)) == per_host.get(host.hostId, 0) <= 10


async def _hosts(platform: Platform, n: int) -> bool:
    return len((await platform.pool()).hosts) == n


@pytest.mark.parametrize(
    ("name", "spec", "reason"),
    [
        ("idle", {"mode": {"function": {"idleTimeoutSeconds": 1}}}, "IdleTimeout"),
        ("total", {"timeoutSeconds": 2}, "Timeout"),
    ],
)
async def test_a_timeout_ends_a_ready_function_and_frees_its_slot(
    platform_factory, name: str, spec: dict[str, Any], reason: str
) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory() as platform:
        run = run_manifest(name, runtime=platform.runtime(), **spec)
        handle, _, address = await ready_on_host(platform, run)
        final = await platform.wait_phase(handle, RunPhase.Timeout, timeout=30)
        assert final.condition(ConditionType.Ready).reason == reason  # type: ignore[union-attr]
        await _unregistered_and_released(platform, run, address)


async def test_a_scale_out_that_cannot_succeed_fails_the_run_with_a_structured_reason(
    platform_factory,
) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(python={"provider": "attach"}) as platform:  # attach with no address
        handle = await platform.start(run_manifest("no-capacity", runtime=platform.runtime()))
        status = await platform.wait_phase(handle, RunPhase.Failed, timeout=60)
        assert status.condition(ConditionType.Ready).reason == "ScaleOutFailed"  # type: ignore[union-attr]
        assert "EndpointMissing" in status.message
        assert (await platform.pool()).hosts == []


async def test_an_unknown_provider_is_rejected_at_admission(platform_factory) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(python={"provider": "nosuchprovider"}) as platform:
        status = await platform.wait_phase(
            await platform.start(run_manifest("np", runtime=platform.runtime())), RunPhase.Failed
        )
        assert status.condition(ConditionType.Ready).reason == "NoProvider"  # type: ignore[union-attr]


@pytest.mark.parametrize("by_sdk", [False, True], ids=["run-admits", "starter-admits"])
async def test_a_run_for_a_runtime_nobody_serves_fails_at_once(platform_factory, by_sdk: bool) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory() as platform:
        run = run_manifest("nort", runtime="no-such-runtime")
        handle = await platform.start(run, by_sdk=by_sdk)
        status = await platform.wait_phase(handle, RunPhase.Failed)
        ready = status.condition(ConditionType.Ready)
        assert ready is not None and ready.reason == "RuntimeUnknown"
        assert ready.message == "no runtime 'no-such-runtime' is configured"
        events = [e async for e in handle.fetch_history_events()]
        told = [
            e
            for e in events
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
            and e.workflow_execution_signaled_event_attributes.signal_name == SIGNAL_REJECTED
        ]
        # The SDK's starter tells the Run itself; a plain start finds out from its own admission.
        assert len(told) == (1 if by_sdk else 0)
        assert not any(e.event_type == EventType.EVENT_TYPE_TIMER_FIRED for e in events)


async def test_a_ready_run_whose_host_dies_recovers_on_a_new_host_with_a_new_attempt(
    platform_factory,
) -> None:  # type: ignore[no-untyped-def]
    import os
    import signal

    from kruntimes.activities.hosts.process import list_records

    async with platform_factory(python={"maxHosts": 2}) as platform:
        run = run_manifest("phoenix", runtime=platform.runtime())
        handle = await platform.start(run)
        before = await platform.wait_phase(handle, RunPhase.Ready)
        record = next(r for r in list_records(platform.state_dir) if r.hostId == before.assignedHost)
        assert record.pid is not None
        os.kill(record.pid, signal.SIGKILL)  # our own host process
        after = await ready_elsewhere(platform, handle, before.assignedHostUID)
        assert after.attempt == before.attempt + 1
        pool = await platform.pool()
        assert before.assignedHostUID not in {h.hostUid for h in pool.hosts}
        assert [r.hostUid for r in pool.reservations] == [after.assignedHostUID]
        address = await address_of(platform, after.assignedHost)  # type: ignore[arg-type]
        answer = invoke_on_host(platform.pki, address, run.metadata.uid, b'{"hi": 1}')  # type: ignore[arg-type]
        assert json.loads(answer.outputs_json)["echo"] == {"hi": 1}
