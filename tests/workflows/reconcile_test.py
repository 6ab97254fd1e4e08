"""The reconciler against a real platform: what was changed behind its back is repaired by a
round (at worker start, or asked for with the `collect` Update), and what is being created right
now is left alone."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.client import WorkflowHandle

from kruntimes.activities.hosts.process import list_records, work_root
from kruntimes.api.phases import RunPhase
from kruntimes.contracts.names import QUERY_RECONCILE, UPDATE_COLLECT, host_workflow_id, reconcile_workflow_id
from kruntimes.contracts.reconcile import ReconcileReport
from kruntimes.decisions.reconciling import PACE, next_round_in
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from tests.support.procs import alive
from tests.support.waiting import eventually
from tests.workflows.conftest import Platform, run_manifest
from tests.workflows.platform_hosts import BEAT_S, host_serving, ready_on_host, registrations, tell_pool

# A grace of one second (twice the assignment timeout): what these tests leave behind is older.
QUICK = {"minHosts": 1, "maxHosts": 2, "assignmentTimeoutSeconds": 0.5}


def reconciler(platform: Platform) -> WorkflowHandle[Any, Any]:
    return platform.client.get_workflow_handle(reconcile_workflow_id(platform.runtime()))


async def collect(platform: Platform) -> ReconcileReport:
    report: ReconcileReport = await reconciler(platform).execute_update(
        UPDATE_COLLECT, result_type=ReconcileReport
    )
    assert report.errors == [], report.errors
    return report


async def repaired(platform: Platform, done: Callable[[ReconcileReport], bool], what: str) -> ReconcileReport:
    """What the rounds asked for did, taken together, once it shows `done`: a round leaves alone
    what is younger than the grace, so it is asked again until what it repairs is older."""
    rounds: list[ReconcileReport] = []

    async def joined() -> ReconcileReport:
        rounds.append(await collect(platform))
        lists = (
            "unregistered",
            "released",
            "deletedHosts",
            "removedWorkspaces",
            "registrationsLost",
            "supervised",
        )
        return rounds[-1].model_copy(
            update={name: [x for r in rounds for x in getattr(r, name)] for name in lists}
            | {"actions": sum(r.actions for r in rounds)}
        )

    report: ReconcileReport = await eventually(joined, until=done, within=30, every=0.1, what=what)
    return report


async def test_a_round_runs_at_worker_start(platform_factory) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(heartbeat_s=BEAT_S, python=QUICK) as platform:

        async def reported() -> bool:
            last = await reconciler(platform).query(QUERY_RECONCILE, result_type=ReconcileReport)
            return last is not None

        await platform.eventually(reported, what="the first round's report")


async def test_a_run_terminated_out_of_band_frees_its_slot_and_its_registration(platform_factory) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(heartbeat_s=BEAT_S, python=QUICK) as platform:
        run = run_manifest("terminated", runtime=platform.runtime())
        handle, _, address = await ready_on_host(platform, run)
        await handle.terminate("out of band")

        report = await repaired(
            platform, lambda r: bool(r.released and r.unregistered), "its slot and registration freed"
        )

        assert report.released == [run.metadata.uid]
        assert report.unregistered == [f"{run.metadata.uid} (RunClosed)"]
        assert (await platform.pool()).reservations == []
        assert registrations(platform.pki, address) == {}


async def test_a_registration_of_a_run_whose_name_another_run_took_is_unregistered(platform_factory) -> None:  # type: ignore[no-untyped-def]
    """The Runs' uids come from visibility's pages: a Run of that name with another uid runs, so
    the first one's registration and slot go, and the second one's stay."""
    async with platform_factory(heartbeat_s=BEAT_S, python=QUICK) as platform:
        first = run_manifest("reused", runtime=platform.runtime())
        handle, host, address = await ready_on_host(platform, first)
        await handle.terminate("out of band")
        second = run_manifest("reused", runtime=platform.runtime())
        assert second.metadata.uid != first.metadata.uid
        again = await platform.wait_phase(await platform.start(second), RunPhase.Ready)

        report = await repaired(
            platform,
            lambda r: bool(r.released and r.unregistered),
            "the first one's slot and registration freed",
        )

        assert report.unregistered == [f"{first.metadata.uid} (RunReplaced)"]
        assert report.released == [first.metadata.uid]
        assert [r.runUid for r in (await platform.pool()).reservations] == [second.metadata.uid]
        if again.assignedHost == host:
            assert list(registrations(platform.pki, address)) == [second.metadata.uid]


async def test_a_round_reads_what_changed_and_a_stale_view_never_costs_a_live_run_its_slot(
    platform_factory,
) -> None:  # type: ignore[no-untyped-def]
    """The reconciler keeps which Runs run across rounds (kruntimes.temporal.known_runs) and reads only what
    changed since its last round. A Run the hosts or the pool mention that its view does not show
    running under that run uid (here: the view lost it, or shows another Run of its name) is
    asked for itself, so a view that is behind never unregisters or releases a live Run."""
    async with platform_factory(heartbeat_s=BEAT_S, python=QUICK) as platform:
        known = platform.known
        assert known is not None
        # Narrow refreshes only, looking back half a second (visibility's lag here is less).
        known.full_refresh_s, known.margin = 3600, timedelta(seconds=0.5)
        runs = [run_manifest(f"viewed-{i}", runtime=platform.runtime()) for i in range(3)]
        placed = [await ready_on_host(platform, run) for run in runs]
        uids = {run.metadata.uid for run in runs}
        placed_at = datetime.now(UTC)  # after the three started and became Ready

        async def looks_back_past_them() -> bool:
            assert (await collect(platform)).actions == 0
            looked_back = known._looked_back  # the start of its last look back: later ones start after it
            return looked_back is not None and looked_back - known.margin > placed_at

        # From then on a round's refresh reads none of the three.
        await platform.eventually(looks_back_past_them, what="a round that looks back past the three Runs")
        assert uids <= set(known.runs)

        lost, replaced = runs[0].metadata.uid, runs[1].metadata.uid
        other = known.runs[replaced]
        known.runs = {uid: run for uid, run in known.runs.items() if uid not in (lost, replaced)}
        known.runs["another-run-of-that-name"] = other
        report = await collect(platform)

        assert (report.unregistered, report.released, report.registrationsLost) == ([], [], [])
        for run, (_, _, address) in zip(runs, placed, strict=True):
            assert run.metadata.uid in registrations(platform.pki, address)
        assert uids <= {r.runUid for r in (await platform.pool()).reservations}
        assert lost not in known.runs  # the round's refresh was narrow: it read none of the three
        known.full_refresh_s = 0  # a full listing mends the view
        assert (await collect(platform)).actions == 0
        assert uids <= set(known.runs) and "another-run-of-that-name" not in known.runs


async def test_a_host_nobody_knows_is_deleted_and_dead_hosts_workspaces_removed(platform_factory) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(heartbeat_s=BEAT_S, python=QUICK) as platform:
        stray = await platform.create_host("stray")
        dead = work_root(platform.state_dir) / "0d6e3a8f-dead-host-uid"
        (dead / "some-run.1").mkdir(parents=True)

        report = await repaired(
            platform,
            lambda r: bool(r.deletedHosts) and "0d6e3a8f-dead-host-uid" in r.removedWorkspaces,
            "the host deleted and the dead host's workspace removed",
        )

        assert report.deletedHosts == [stray.hostId]
        assert stray.pid is not None and not alive(stray.pid)
        assert all(r.hostId != stray.hostId for r in list_records(platform.state_dir))
        assert "0d6e3a8f-dead-host-uid" in report.removedWorkspaces and not dead.exists()
        assert not (work_root(platform.state_dir) / stray.hostUid).exists()


async def test_a_host_whose_supervisor_is_gone_is_supervised_again(platform_factory) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(heartbeat_s=BEAT_S, python=QUICK) as platform:
        await platform.eventually(lambda: _one_host(platform), what="the warm host")
        [host] = (await platform.pool()).hosts
        supervisor = platform.client.get_workflow_handle(host_workflow_id(platform.runtime(), host.hostId))
        await supervisor.terminate("out of band")

        report = await repaired(platform, lambda r: bool(r.supervised), "the host supervised again")

        assert report.supervised == [host.hostId]
        await host_serving(platform, host.hostId)


async def _one_host(platform: Platform) -> bool:
    return len((await platform.pool()).hosts) == 1


async def test_a_ready_run_whose_registration_vanished_unseen_is_told_and_registers_again(
    platform_factory,
) -> None:  # type: ignore[no-untyped-def]
    """A host nobody watches (it has no HostWorkflow): only the reconciler can see the loss."""
    async with platform_factory(heartbeat_s=BEAT_S, python={**QUICK, "minHosts": 0}) as platform:
        runtime = platform.runtime()
        created = await platform.create_host("unwatched")
        await tell_pool(platform, created, supervised=False)
        run = run_manifest("unwatched", runtime=runtime)
        handle = await platform.start(run)
        status = await platform.wait_phase(handle, RunPhase.Ready)
        assert status.assignedHostUID == created.hostUid
        old = registrations(platform.pki, created.address)[run.metadata.uid]  # type: ignore[index]
        with platform.pki.channel(created.address, as_=platform.pki.control_plane) as channel:
            pb_grpc.FunctionRuntimeStub(channel).UnregisterFunction(
                pb.UnregisterFunctionRequest(registration_id=old), timeout=30
            )

        report = await repaired(platform, lambda r: bool(r.registrationsLost), "the Run told")

        assert report.registrationsLost == [run.metadata.uid]

        async def registered_again() -> bool:
            return registrations(platform.pki, created.address).get(run.metadata.uid, old) != old  # type: ignore[arg-type]

        await platform.eventually(registered_again, what="the Run registered again")
        after = await platform.wait_phase(handle, RunPhase.Ready)
        assert (after.attempt, after.recoveries) == (1, 0)


async def test_what_is_younger_than_the_grace_is_left_alone(platform_factory) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(
        heartbeat_s=BEAT_S, python={**QUICK, "assignmentTimeoutSeconds": 60.0}
    ) as platform:
        dead = work_root(platform.state_dir) / "young-dead-host-uid"
        dead.mkdir(parents=True)
        report = await collect(platform)
        assert report.actions == 0 and dead.exists()
        shutil.rmtree(dead)


def _round_and_wait(events: list[Any]) -> tuple[float, float] | None:
    """The first periodic round in a reconciler's history: how long it took as the workflow saw
    it (from the task that scheduled it to the task that saw it complete) and the wait that
    followed (its timer); None before that timer is started."""
    started_at = None  # the time of the latest WorkflowTaskStarted
    began = took = None
    completed = False
    for event in events:
        if event.HasField("workflow_task_started_event_attributes"):
            started_at = event.event_time.ToDatetime()
            if began is not None and took is None and completed:
                took = (started_at - began).total_seconds()
        elif event.HasField("activity_task_scheduled_event_attributes") and began is None:
            began, completed = started_at, False
        elif event.HasField("activity_task_completed_event_attributes") and began is not None:
            completed = True
        elif event.HasField("timer_started_event_attributes") and took is not None:
            return (
                took,
                event.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta().total_seconds(),
            )
    return None


async def test_the_next_round_waits_in_proportion_to_the_last(platform_factory) -> None:  # type: ignore[no-untyped-def]
    """A round reads every Run of its runtime: the wait after it is next_round_in(interval, how
    long it took), so the reconciler's share of the time stays bounded however many Runs there are."""
    async with platform_factory(
        heartbeat_s=BEAT_S, python=QUICK, config={"reconcileIntervalSeconds": 1.0}
    ) as platform:
        handle = reconciler(platform)
        seen: list[tuple[float, float]] = []

        async def timed() -> bool:
            found = _round_and_wait([e async for e in handle.fetch_history_events()])
            if found is not None:
                seen.append(found)
            return found is not None

        await platform.eventually(timed, what="the reconciler's first timer")
        took, wait = seen[-1]
        assert took > 0
        assert wait == pytest.approx(next_round_in(1.0, took), abs=0.005)
        assert wait == pytest.approx(max(1.0, PACE * took), abs=0.005)


async def test_without_an_interval_rounds_run_only_when_asked(platform_factory) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(
        heartbeat_s=BEAT_S, python=QUICK, config={"reconcileIntervalSeconds": None}
    ) as platform:
        first = await collect(platform)
        second = await collect(platform)
        assert second.at > first.at
        events = [e async for e in reconciler(platform).fetch_history_events()]
        assert not any(e.HasField("workflow_task_failed_event_attributes") for e in events)
        assert not any(e.HasField("timer_started_event_attributes") for e in events)
