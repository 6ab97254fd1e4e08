"""Hour-long timers on the time-skipping test server, with activities replaced by stand-ins."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType, IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from kruntimes.activities.handoff import HandoffActivities, Mailbox, Register
from kruntimes.activities.signals import SignalActivities
from kruntimes.api.phases import RunPhase
from kruntimes.api.status import ConditionType, RunStatus
from kruntimes.config.runtimes import RuntimeConfig
from kruntimes.contracts.hostcalls import RegisterInput, RegisterResult
from kruntimes.contracts.names import (
    POOL_TASK_QUEUE,
    QUERY_POOL,
    QUERY_STATUS,
    SIGNAL_ADMIT,
    SIGNAL_ADMIT_MANY,
    SIGNAL_CANCEL,
    TASK_QUEUE,
    pool_workflow_id,
    run_workflow_id,
)
from kruntimes.contracts.platform_info import PlatformInfo
from kruntimes.contracts.pool import PoolConfig, PoolInput, PoolState, admit_signal
from kruntimes.contracts.run import AwaitAssignmentInput, OutgoingSignal, RunInput, SignalBatch, SignalResult
from kruntimes.sdk.starting import admit, start_run
from kruntimes.temporal.connect import DATA_CONVERTER
from kruntimes.temporal.devserver import SEARCH_ATTRIBUTES
from kruntimes.workers.assembly import POOL_WORKFLOWS, RUN_WORKFLOWS
from kruntimes.workflows.pool import RuntimePoolWorkflow
from kruntimes.workflows.run import ADMIT_GRACE, RunWorkflow
from tests.support.waiting import eventually
from tests.workflows.conftest import run_manifest
from tests.workflows.handoffs import assignment, until_waiting
from tests.workflows.standin_host import StandInHostWorkflow
from tests.workflows.standins import FakeHosts

HOUR = 3600
DAY = 24 * HOUR


TEST_SERVER_STARTUP = timedelta(seconds=60)


@pytest.fixture(scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    server = Path(sys.executable).with_name("temporal-test-server")
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=DATA_CONVERTER,
        test_server_existing_path=str(server),
        # The SDK waits 5 s for it by default; with the suite loading both cores it once took longer.
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


@dataclass(frozen=True)
class Queues:
    """The task queues of one test's workers: no other test's workflows or pollers on them."""

    run: str
    pool: str


async def _start_pool(client: Client, runtime: str, queues: Queues) -> None:
    await client.start_workflow(
        RuntimePoolWorkflow.run,
        PoolInput(
            config=PoolConfig(
                # Hours are skipped here: no periodic probes, and no scale-in of the idle host
                # (tests/workflows/hosts_test.py covers scale-in against real hosts).
                runtime=RuntimeConfig(
                    name=runtime, adapter="python", runs=5, maxHosts=1, scaleInDelaySeconds=float(DAY)
                ),
                platform=PlatformInfo(stateDir="/nonexistent-stand-ins-create-no-hosts"),
                probeIntervalSeconds=None,
                runTaskQueue=queues.run,
            )
        ),
        id=pool_workflow_id(runtime),
        task_queue=queues.pool,
    )


async def _start(client: Client, runtime: str, queues: Queues, **spec: object) -> object:
    await _start_pool(client, runtime, queues)
    run = run_manifest(f"idle-{uuid.uuid4().hex[:6]}", runtime=runtime, **spec)  # type: ignore[arg-type]
    return await client.start_workflow(
        RunWorkflow.run,
        RunInput(run=run),
        id=run_workflow_id("default", run.metadata.name),
        task_queue=queues.run,
    )


async def _until_ready(env: WorkflowEnvironment, handle: object) -> None:
    await _until_phase(env, handle, RunPhase.Ready)


async def _until_phase(env: WorkflowEnvironment, handle: object, phase: RunPhase) -> RunStatus:
    """The Run's status once it is in `phase`, the test server's clock moved a second between looks
    (its timers, such as retry backoffs, fire only as the clock moves)."""
    status: RunStatus = await eventually(
        lambda: _phase(handle),
        until=lambda s: s.phase is phase,
        every=1,
        pause=env.sleep,
        within=60,
        what=f"the Run {phase}",
    )
    return status


@asynccontextmanager
async def _workers(
    env: WorkflowEnvironment,
    fake: FakeHosts,
    mailbox: Mailbox | None = None,
    register: Register | None = None,
) -> AsyncIterator[Queues]:
    """The real workflows with stand-in host activities and the real signalling activities, on
    task queues of their own."""
    suffix = uuid.uuid4().hex[:8]
    queues = Queues(run=f"{TASK_QUEUE}-{suffix}", pool=f"{POOL_TASK_QUEUE}-{suffix}")
    mailbox = mailbox or Mailbox()
    signals = SignalActivities(env.client, mailbox)
    async with _run_worker(env, fake, signals, queues, register), _pool_worker(env, fake, signals, queues):
        yield queues


def _run_worker(
    env: WorkflowEnvironment,
    fake: FakeHosts,
    signals: SignalActivities,
    queues: Queues,
    register: Register | None = None,
) -> Worker:
    handoff = HandoffActivities(signals.mailbox, register=register or fake.register)
    run_activities = [*fake.activities(), signals.admit_run, handoff.await_assignment]
    # Every workflow of the Runs' queue, the HostWorkflow as a stand-in that watches nothing.
    run_workflows = [w for w in RUN_WORKFLOWS if w.__name__ != "HostWorkflow"] + [StandInHostWorkflow]
    return Worker(env.client, task_queue=queues.run, workflows=run_workflows, activities=run_activities)


def _pool_worker(
    env: WorkflowEnvironment,
    fake: FakeHosts,
    signals: SignalActivities,
    queues: Queues,
    signal_runs: object | None = None,
) -> Worker:
    return Worker(
        env.client,
        task_queue=queues.pool,
        workflows=POOL_WORKFLOWS,
        activities=[fake.probe, signal_runs or signals.signal_runs],
    )


class SlowServer:
    """signal_runs as a server too slow to take signals makes it: the pool's local activity sends
    nothing within its budget and hands it all back; the ordinary activity sends it."""

    def __init__(self, signals: SignalActivities) -> None:
        self.signals = signals
        self.left_over = 0
        self.sent_later = 0

    @activity.defn(name="signal_runs")
    async def signal_runs(self, batch: SignalBatch) -> SignalResult:
        if activity.info().is_local and batch.budgetSeconds > 0:
            self.left_over += len(batch.signals)
            return SignalResult(unsent=batch.signals)
        self.sent_later += len(batch.signals)
        return await self.signals.signal_runs(batch)


async def _phase(handle: object) -> RunStatus:
    return await handle.query(QUERY_STATUS, result_type=RunStatus)  # type: ignore[attr-defined, no-any-return]


async def test_an_invocation_in_the_idle_window_postpones_expiry(env: WorkflowEnvironment) -> None:
    fake = FakeHosts()
    async with _workers(env, fake) as queues:
        handle = await _start(env.client, "py-idle", queues, mode={"function": {"idleTimeoutSeconds": HOUR}})
        await _until_ready(env, handle)
        fake.last_activity = await env.get_current_time()  # registered now
        await env.sleep(HOUR / 2)
        fake.last_activity = await env.get_current_time()  # an invocation half-way through
        await env.sleep(HOUR * 0.75)  # the first timer fired at 1 h and re-armed for 1.5 h
        assert (await _phase(handle)).phase is RunPhase.Ready
        assert fake.status_calls >= 1
        await env.sleep(HOUR)
        status = await _phase(handle)
        assert status.phase is RunPhase.Timeout
        ready = status.condition(ConditionType.Ready)
        assert ready is not None and ready.reason == "IdleTimeout"
        assert fake.unregistered, "expiry unregisters the function"


async def test_the_total_timeout_ends_a_ready_run_after_hours(env: WorkflowEnvironment) -> None:
    fake = FakeHosts()
    async with _workers(env, fake) as queues:
        handle = await _start(env.client, "py-total", queues, timeoutSeconds=3 * HOUR)
        await _until_ready(env, handle)
        await env.sleep(2 * HOUR)
        assert (await _phase(handle)).phase is RunPhase.Ready
        await env.sleep(HOUR + 60)
        status = await _phase(handle)
        assert status.phase is RunPhase.Timeout
        assert status.condition(ConditionType.Ready).reason == "Timeout"  # type: ignore[union-attr]
        assert fake.unregistered


async def _until_signals_handled(handle: WorkflowHandle[Any, Any], *, timeout: float = 30.0) -> None:
    """Return once a workflow task has completed after the workflow's last signal: the workflow
    code has seen every signal sent so far (polled in real time; nothing is skipped)."""

    async def events() -> list[EventType.ValueType]:
        return [e.event_type async for e in handle.fetch_history_events()]

    def handled(events: list[EventType.ValueType]) -> bool:
        signalled = [i for i, t in enumerate(events) if t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED]
        completed = [i for i, t in enumerate(events) if t == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]
        return bool(signalled and completed and completed[-1] > signalled[-1])

    await eventually(
        events, until=handled, within=timeout, every=0.05, what=f"{handle.id} to handle its signals"
    )


async def _pool(client: Client, runtime: str) -> PoolState:
    handle = client.get_workflow_handle(pool_workflow_id(runtime))
    return await handle.query(QUERY_POOL, result_type=PoolState)  # type: ignore[no-any-return]


async def test_a_run_whose_starter_never_admitted_it_asks_the_pool_after_the_grace(
    env: WorkflowEnvironment,
) -> None:
    """The starter died between starting the Run and sending its admission: nothing reached the
    pool, and the Run asks for itself once ADMIT_GRACE is over."""
    fake = FakeHosts()
    async with _workers(env, fake) as queues:
        await _start_pool(env.client, "py-grace", queues)
        run = run_manifest(f"grace-{uuid.uuid4().hex[:6]}", runtime="py-grace")
        handle = await env.client.start_workflow(
            RunWorkflow.run,
            RunInput(run=run, starterAdmits=True),  # ... and no admission follows
            id=run_workflow_id("default", run.metadata.name),
            task_queue=queues.run,
        )
        await env.sleep(ADMIT_GRACE.total_seconds() / 2)
        assert (await _phase(handle)).phase is RunPhase.Pending
        assert not (await _pool(env.client, "py-grace")).reservations, "nobody asked yet"
        await _until_ready(env, handle)
        assert fake.registered == {run.metadata.uid: 1}


async def test_an_admission_sent_twice_takes_one_slot(env: WorkflowEnvironment) -> None:
    """A starter that sent the admission, and the Run asking again after its grace period (the
    starter's signal was slow, not lost): the pool admits the Run once."""
    fake = FakeHosts()
    async with _workers(env, fake) as queues:
        await _start_pool(env.client, "py-twice", queues)
        run = run_manifest(f"twice-{uuid.uuid4().hex[:6]}", runtime="py-twice")
        handle = await start_run(env.client, run, task_queue=queues.run)
        await admit(env.client, run, handle)  # a second copy of the starter's admission
        await _until_ready(env, handle)
        pool_handle = env.client.get_workflow_handle(pool_workflow_id("py-twice"))
        await pool_handle.signal(
            SIGNAL_ADMIT, admit_signal(run, workflow_id=handle.id, at=datetime.now(UTC))
        )  # and a third, after the Run is Ready
        await _until_signals_handled(pool_handle)
        pool = await _pool(env.client, "py-twice")
        assert [r.runUid for r in pool.reservations] == [run.metadata.uid]
        assert fake.registered == {run.metadata.uid: 1}


async def test_an_admission_before_its_runs_start_is_sent_only_where_the_answer_waits_for_the_run(
    env: WorkflowEnvironment,
) -> None:
    """`admit_run_early` (a Function's replica admitted before its start): with the pools' or the
    Runs' tasks elsewhere the pool's answer would be signalled to a Run not started yet, so it
    is not sent (the admission follows the start); with both here it is, and the pool gets it."""
    async with _workers(env, FakeHosts()) as queues:
        await _start_pool(env.client, "py-early", queues)
        pool_handle = env.client.get_workflow_handle(pool_workflow_id("py-early"))
        run = run_manifest(f"early-{uuid.uuid4().hex[:6]}", runtime="py-early")
        early = admit_signal(
            run, workflow_id=run_workflow_id("default", run.metadata.name), at=datetime.now(UTC), handoff=True
        )
        for pools_local, runs_local in ((False, True), (True, False)):
            mailbox = Mailbox()
            mailbox.pools_local, mailbox.runs_local = pools_local, runs_local
            assert not await ActivityEnvironment().run(
                SignalActivities(env.client, mailbox).admit_run_early, early
            )
        mailbox = Mailbox()
        mailbox.pools_local = mailbox.runs_local = True
        assert await ActivityEnvironment().run(SignalActivities(env.client, mailbox).admit_run_early, early)

        async def admitted() -> bool:
            return "admit" in await _signal_names(env.client, pool_handle.id)

        await eventually(admitted, what="the early admission in the pool's history")
        assert (await _signal_names(env.client, pool_handle.id)).count("admit") == 1  # the local one only


async def test_an_assignment_handed_over_in_process_is_not_also_signalled(env: WorkflowEnvironment) -> None:
    """signal_runs skips the signal for a Run that took its answer from the mailbox; the others
    are signalled (here: to workflows that do not exist, which the result reports)."""
    mailbox = Mailbox()
    signals = SignalActivities(env.client, mailbox)
    handed = assignment("uid-handed")
    mailbox.pool_answered("rt")
    waiting = asyncio.ensure_future(
        mailbox.wait(
            AwaitAssignmentInput(
                workflowId="run/default/handed", runUid="uid-handed", runtime="rt", timeoutSeconds=30
            )
        )
    )
    await until_waiting(mailbox, "run/default/handed", "uid-handed")
    batch = SignalBatch(
        runtime="rt",
        signals=[
            OutgoingSignal(workflowId="run/default/handed", assigned=handed),
            OutgoingSignal(workflowId="run/default/absent", assigned=assignment("uid-absent")),
        ],
    )
    result = await ActivityEnvironment().run(signals.signal_runs, batch)
    assert await waiting == handed
    assert result.unreachable == ["run/default/absent"]


async def _signal_names(client: Client, workflow_id: str) -> list[str]:
    return [
        e.workflow_execution_signaled_event_attributes.signal_name
        async for e in client.get_workflow_handle(workflow_id).fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    ]


async def test_runs_whose_first_task_comes_after_their_pools_answer_take_it_unsignalled(
    env: WorkflowEnvironment,
) -> None:
    """A burst: the pool answers its starters' admissions before the Runs' first tasks run (here
    no worker polls the Runs' queue meanwhile). With the Runs' and the pools' tasks all in this
    process, the answers wait in the mailbox instead of being signalled; each Run takes its own in
    its first task, registers attempt 1 there and is Ready, with no `assigned` signal."""
    fake = FakeHosts()
    mailbox = Mailbox(park_s=600)
    mailbox.pools_local = mailbox.runs_local = True  # as watch_pool_pollers finds for one process
    signals = SignalActivities(env.client, mailbox)
    suffix = uuid.uuid4().hex[:8]
    queues = Queues(run=f"{TASK_QUEUE}-{suffix}", pool=f"{POOL_TASK_QUEUE}-{suffix}")
    runs_first = _run_worker(env, fake, signals, queues)  # (it makes the stand-ins, the probe too)
    async with _pool_worker(env, fake, signals, queues):
        async with runs_first:
            await _start_pool(env.client, "py-park", queues)
            first = await start_run(
                env.client, run_manifest(f"park-{suffix}", runtime="py-park"), task_queue=queues.run
            )
            await _until_ready(env, first)  # the pool has its host
        runs = [run_manifest(f"park-{i}-{suffix}", runtime="py-park") for i in range(3)]
        handles = [await start_run(env.client, run, task_queue=queues.run) for run in runs]
        await eventually(lambda: mailbox.parked() == len(runs), within=30, what="the answers parked")
        async with _run_worker(env, fake, signals, queues):
            for handle in handles:
                await _until_ready(env, handle)
        for handle in handles:
            assert "assigned" not in await _signal_names(env.client, handle.id)
        assert all(fake.registered[run.metadata.uid or ""] == 1 for run in runs)
        assert mailbox.parked() == 0


async def test_a_parked_answer_whose_run_is_gone_frees_its_slot(env: WorkflowEnvironment) -> None:
    """An answer parked for a Run that never takes it is signalled after the parking time; a Run
    that is gone then gets its slot released in the pool, as a failed signal from the pool's task
    does. An answer not marked for parking (pools from before) is signalled at once."""
    fake = FakeHosts()
    mailbox = Mailbox(park_s=0.2)
    mailbox.pools_local = mailbox.runs_local = True
    signals = SignalActivities(env.client, mailbox)
    suffix = uuid.uuid4().hex[:8]
    queues = Queues(run=f"{TASK_QUEUE}-{suffix}", pool=f"{POOL_TASK_QUEUE}-{suffix}")
    async with _run_worker(env, fake, signals, queues), _pool_worker(env, fake, signals, queues):
        await _start_pool(env.client, "py-gone", queues)
        first = await start_run(
            env.client, run_manifest(f"gone-{suffix}", runtime="py-gone"), task_queue=queues.run
        )
        await _until_ready(env, first)
        ghost = run_manifest(f"ghost-{suffix}", runtime="py-gone")
        pool_handle = env.client.get_workflow_handle(pool_workflow_id("py-gone"))
        ghost_id = run_workflow_id("default", ghost.metadata.name)  # no such workflow
        await pool_handle.signal(
            SIGNAL_ADMIT, admit_signal(ghost, workflow_id=ghost_id, at=datetime.now(UTC), handoff=True)
        )

        async def ghost_released() -> bool:
            held = {r.runUid for r in (await _pool(env.client, "py-gone")).reservations}
            return ghost.metadata.uid not in held and bool(held)

        await eventually(lambda: mailbox.parked() == 1, within=30, what="the ghost's answer parked")
        await eventually(ghost_released, within=30, what="the ghost's slot released")
    old = SignalBatch(
        runtime="py-gone", signals=[OutgoingSignal(workflowId=ghost_id, assigned=assignment("uid-ghost"))]
    )
    result = await ActivityEnvironment().run(signals.signal_runs, old)
    assert result.unreachable == [ghost_id]  # signalled (and found gone) in the activity itself
    assert mailbox.parked() == 0


async def test_signals_the_pools_local_activity_left_unsent_go_out_in_an_ordinary_activity(
    env: WorkflowEnvironment,
) -> None:
    fake = FakeHosts()
    signals = SignalActivities(env.client, Mailbox())
    slow = SlowServer(signals)
    suffix = uuid.uuid4().hex[:8]
    queues = Queues(run=f"{TASK_QUEUE}-{suffix}", pool=f"{POOL_TASK_QUEUE}-{suffix}")
    async with (
        _run_worker(env, fake, signals, queues),
        _pool_worker(env, fake, signals, queues, signal_runs=slow.signal_runs),
    ):
        handle = await _start(env.client, "py-slow-signals", queues)  # it asks the pool itself
        await _until_ready(env, handle)
    assert slow.left_over >= 1 and slow.sent_later >= 1
    pool = env.client.get_workflow_handle(pool_workflow_id("py-slow-signals"))
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        async for e in pool.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert "signal_runs" in scheduled


async def test_the_signalling_activity_hands_back_what_it_did_not_send_within_its_budget(
    env: WorkflowEnvironment,
) -> None:
    signals = SignalActivities(env.client, Mailbox())
    batch = SignalBatch(
        runtime="rt",
        signals=[
            OutgoingSignal(workflowId=f"run/default/absent-{i}", assigned=assignment(f"u{i}"))
            for i in range(40)
        ],
        budgetSeconds=1e-6,
    )
    result = await ActivityEnvironment().run(signals.signal_runs, batch)
    assert result.unsent, "nothing gets through a server in a microsecond"
    assert {o.workflowId for o in result.unsent} | set(result.unreachable) == {
        o.workflowId for o in batch.signals
    }
    unbounded = await ActivityEnvironment().run(
        signals.signal_runs, batch.model_copy(update={"budgetSeconds": 0.0})
    )
    assert not unbounded.unsent and len(unbounded.unreachable) == 40  # pools from before: all sent


async def test_admissions_created_together_reach_the_pool_in_few_signals_and_all_get_slots(
    env: WorkflowEnvironment,
) -> None:
    """Five Runs (the pool's five slots) created at once by one process: their admissions reach
    the pool in fewer signals than Runs (those queued while one is in flight go together), and
    each Run is admitted once."""
    fake = FakeHosts()
    async with _workers(env, fake) as queues:
        await _start_pool(env.client, "py-many", queues)
        runs = [run_manifest(f"many-{i}-{uuid.uuid4().hex[:4]}", runtime="py-many") for i in range(5)]
        handles = await asyncio.gather(*(start_run(env.client, r, task_queue=queues.run) for r in runs))
        for handle in handles:
            await _until_ready(env, handle)
        pool_events = [
            e
            async for e in env.client.get_workflow_handle(pool_workflow_id("py-many")).fetch_history_events()
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
            and e.workflow_execution_signaled_event_attributes.signal_name
            in (SIGNAL_ADMIT, SIGNAL_ADMIT_MANY)
        ]
        assert 1 <= len(pool_events) < 5
        assert sorted(r.runUid for r in (await _pool(env.client, "py-many")).reservations) == sorted(
            r.metadata.uid for r in runs
        )


async def test_a_cancel_seen_with_the_handoff_registration_still_unregisters_it(
    env: WorkflowEnvironment,
) -> None:
    """The handoff registered attempt 1 while a cancel arrived (the handoff ends within its bound,
    and the cancel is seen in the task after it): the Run ends Cancelled and its cleanup
    unregisters what the handoff registered, leaving nothing on the host."""
    fake = FakeHosts()
    mailbox = Mailbox()
    mailbox.pools_local = True
    registering, release = asyncio.Event(), asyncio.Event()

    async def slow_register(request: RegisterInput) -> RegisterResult:
        registering.set()
        await release.wait()
        return await fake.register(request)

    async with _workers(env, fake, mailbox=mailbox, register=slow_register) as queues:
        await _start_pool(env.client, "py-race", queues)
        run = run_manifest(f"race-{uuid.uuid4().hex[:6]}", runtime="py-race")
        handle = await env.client.start_workflow(
            RunWorkflow.run,
            RunInput(run=run, starterAdmits=True),
            id=run_workflow_id("default", run.metadata.name),
            task_queue=queues.run,
        )
        await admit(env.client, run, handle)
        await asyncio.wait_for(registering.wait(), 30)
        await handle.signal(SIGNAL_CANCEL)  # accepted while the first task's registration is held
        release.set()
        await _until_phase(env, handle, RunPhase.Cancelled)
        assert fake.unregistered == [f"reg-{run.metadata.uid}"]


async def test_a_cancel_after_the_handoff_gave_its_registration_up_still_unregisters_it(
    env: WorkflowEnvironment,
) -> None:
    """The handoff's registration of attempt 1 does not return within the handoff's bound (the
    host may still make it): the handoff gives it up and the first task completes; the Run,
    cancelled before it registered again, learns the registration (the same attempt, idempotent)
    so that its cleanup unregisters it, and no workflow task of the Run timed out."""
    fake = FakeHosts()
    mailbox = Mailbox()
    mailbox.pools_local = True
    held = asyncio.Event()
    calls: list[RegisterInput] = []

    async def held_register(request: RegisterInput) -> RegisterResult:
        calls.append(request)
        held.set()
        await asyncio.Event().wait()  # never answers: the handoff gives up (and cancels this)
        raise AssertionError("unreachable")

    async with _workers(env, fake, mailbox=mailbox, register=held_register) as queues:
        await _start_pool(env.client, "py-held", queues)
        run = run_manifest(f"held-{uuid.uuid4().hex[:6]}", runtime="py-held")
        handle = await start_run(env.client, run, task_queue=queues.run)
        await asyncio.wait_for(held.wait(), 30)
        await handle.signal(SIGNAL_CANCEL)
        await _until_phase(env, handle, RunPhase.Cancelled)
        assert [c.attempt for c in calls] == [1]  # the handoff's, given up
        assert fake.registered == {run.metadata.uid: 1}  # learned again before the cleanup
        assert fake.unregistered == [f"reg-{run.metadata.uid}"]
        events = [e.event_type async for e in handle.fetch_history_events()]
        assert EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT not in events
