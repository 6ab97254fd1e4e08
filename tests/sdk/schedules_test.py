"""Schedules on the real dev server: a schedule starts task Runs named NAME-<time> on its interval,
skips a start while its last Run still runs (overlap skip), starts none while paused, and a
trigger starts one at once; every input is checked before it reaches Temporal."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from kruntimes.api.phases import TERMINAL_PHASES, RunPhase
from kruntimes.api.run import Run
from kruntimes.client import Client
from kruntimes.lifecycle import schedule_id
from kruntimes.sdk.errors import InvalidSchedule, ScheduleAlreadyExists, ScheduleNotFound
from kruntimes.sdk.schedules import check_cron, parse_duration
from tests.cli.conftest import krt as krt_cli
from tests.cli.conftest import one_error_line
from tests.sdk.stack import TASK, Platform, manifest, unique

BLOCKING = "import time\ndef handle(p):\n    time.sleep(120)\n    return {}\n"


def _task(source: str = TASK) -> Run:
    return Run.from_dict(manifest("template", source=source, mode={"task": {}}, ttlSecondsAfterFinished=300))


async def _eventually(check: Callable[[], Awaitable[bool]], *, within: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def _runs_of(krt: Client, schedule: str) -> list[Run]:
    pattern = re.compile(rf"^{re.escape(schedule)}-\d{{14}}$")
    return [r for r in await krt.list() if pattern.match(r.metadata.name)]


async def _delete_all(krt: Client, schedule: str) -> None:
    for run in await _runs_of(krt, schedule):
        await krt.delete(run.metadata.name)


async def test_a_schedule_starts_named_task_runs_pauses_and_triggers(krt: Client) -> None:
    name = unique("every")
    view = await krt.schedules.create(name, _task(), namespace="default", every=timedelta(seconds=2))
    assert (view.every, view.overlap, view.paused, view.runtime) == (
        timedelta(seconds=2),
        "skip",
        False,
        "python",
    )
    try:

        async def two_succeeded() -> bool:
            runs = await _runs_of(krt, name)
            return sum(1 for r in runs if r.status.phase is RunPhase.Succeeded) >= 2

        await _eventually(two_succeeded, within=30, what="two scheduled Runs")
        runs = await _runs_of(krt, name)
        assert all(r.spec.mode.kind == "task" and r.uid for r in runs)
        assert len({r.uid for r in runs}) == len(runs), "each start is a Run of its own"
        got = await krt.schedules.get(name, "default")
        assert set(got.recentRuns) >= {r.metadata.name for r in runs if r.status.phase is RunPhase.Succeeded}
        assert name in [v.name for v in await krt.schedules.list("default")]

        await krt.schedules.pause(name, "default", note="maintenance")
        paused = await krt.schedules.get(name, "default")
        assert paused.paused and paused.note == "maintenance"
        await _delete_all(krt, name)
        count = len(paused.recentRuns)
        await krt.schedules.trigger(name, "default")  # starts one though paused

        async def triggered() -> bool:
            return len((await krt.schedules.get(name, "default")).recentRuns) > count

        await _eventually(triggered, within=20, what="the triggered start")

        async def run_started() -> bool:
            return bool(await _runs_of(krt, name))

        await _eventually(run_started, within=20, what="the triggered Run")
        await krt.schedules.unpause(name, "default")
        assert not (await krt.schedules.get(name, "default")).paused
        with pytest.raises(ScheduleAlreadyExists):
            await krt.schedules.create(name, _task(), namespace="default", every=timedelta(seconds=2))
    finally:
        await krt.schedules.delete(name, "default")
        await _delete_all(krt, name)
    with pytest.raises(ScheduleNotFound):
        await krt.schedules.get(name, "default")


async def test_overlap_skip_starts_nothing_while_the_last_run_still_runs(krt: Client) -> None:
    name = unique("skip")
    await krt.schedules.create(name, _task(BLOCKING), namespace="default", every=timedelta(seconds=1))
    try:

        async def skipped_twice() -> bool:
            return (await krt.schedules.get(name, "default")).skippedOverlap >= 2

        await _eventually(skipped_twice, within=30, what="two starts skipped")
        runs = await _runs_of(krt, name)
        assert len(runs) == 1 and runs[0].status.phase in (
            RunPhase.Pending,
            RunPhase.Scheduled,
            RunPhase.Running,
        )
    finally:
        await krt.schedules.delete(name, "default")
        await _delete_all(krt, name)


async def test_every_schedule_input_is_checked(krt: Client) -> None:
    for bad in ("0 3 * *", "every day", "0 3 * * * * * *", "x" * 300):
        with pytest.raises(InvalidSchedule, match="cron"):
            check_cron(bad)
    assert check_cron(" 0  3 * * 1-5 ") == "0 3 * * 1-5" and check_cron("@hourly") == "@hourly"
    assert parse_duration("1h30m") == timedelta(minutes=90) and parse_duration("45") == timedelta(seconds=45)
    for bad in ("0s", "400d", "5 minutes", "", "-3s"):
        with pytest.raises(InvalidSchedule):
            parse_duration(bad)
    every = timedelta(minutes=5)
    with pytest.raises(InvalidSchedule, match="DNS"):
        await krt.schedules.create("Bad_Name", _task(), namespace="default", every=every)
    with pytest.raises(InvalidSchedule, match="at most"):
        await krt.schedules.create("n" * 50, _task(), namespace="default", every=every)
    with pytest.raises(InvalidSchedule, match="task Run"):
        await krt.schedules.create("fn", Run.from_dict(manifest("fn")), namespace="default", every=every)
    with pytest.raises(InvalidSchedule, match="exactly one"):
        await krt.schedules.create("both", _task(), namespace="default", every=every, cron="@daily")
    with pytest.raises(InvalidSchedule, match="Temporal refused"):  # the right shape, impossible values
        await krt.schedules.create(unique("late"), _task(), namespace="default", cron="99 3 * * *")
    with pytest.raises(ScheduleNotFound):
        await krt.schedules.pause("no-such-schedule", "default")


async def test_krt_schedule_create_list_and_a_bad_cron(platform: Platform, tmp_path: Path) -> None:
    name = unique("cli")
    task = tmp_path / "task.yaml"
    task.write_text(yaml.safe_dump(manifest("template", source=TASK, mode={"task": {}})))
    bad = await krt_cli(platform, "schedule", "create", name, "--cron", "0 3 * *", "-f", str(task))
    assert bad.code == 2 and "not a cron expression" in one_error_line(bad.err)
    made = await krt_cli(
        platform, "schedule", "create", name, "--cron", "0 3 * * *", "-f", str(task), "--paused"
    )
    assert (made.code, made.out) == (0, f"schedule/{name} created (paused)\n"), made.err
    try:
        listed = await krt_cli(platform, "schedule", "list")
        assert listed.code == 0 and name in listed.out and "0 3 * * *" in listed.out, listed.err
    finally:
        gone = await krt_cli(platform, "schedule", "delete", name)
        assert gone.code == 0, gone.err
    missing = await krt_cli(platform, "schedule", "get", name)
    assert missing.code == 3 and "krt schedule list" in one_error_line(missing.err)


async def test_overlap_buffer_one_keeps_one_start_and_allow_all_starts_every_time(krt: Client) -> None:
    buffered, every = unique("buffer"), unique("all")
    await krt.schedules.create(
        buffered, _task(BLOCKING), namespace="default", every=timedelta(seconds=1), overlap="buffer-one"
    )
    await krt.schedules.create(
        every, _task(BLOCKING), namespace="default", every=timedelta(seconds=1), overlap="allow-all"
    )
    temporal = await krt.temporal()
    try:

        async def one_kept() -> bool:
            info = (
                await temporal.get_schedule_handle(schedule_id("default", buffered)).describe()
            ).raw_description.info
            return info.buffer_size == 1

        async def three_running() -> bool:
            runs = await _runs_of(krt, every)
            return sum(1 for r in runs if r.status.phase not in TERMINAL_PHASES) >= 3

        await _eventually(one_kept, within=30, what="buffer-one to keep a start for later")
        await _eventually(three_running, within=30, what="allow-all to start Runs side by side")
        # buffer-one ran one Run and keeps exactly one start, however many came meanwhile.
        assert len(await _runs_of(krt, buffered)) == 1
        assert (await krt.schedules.get(buffered, "default")).overlap == "buffer-one"
    finally:
        for name in (buffered, every):
            await krt.schedules.delete(name, "default")
            await _delete_all(krt, name)
