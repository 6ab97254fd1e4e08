"""Schedules on the real dev server: a schedule starts task Runs named NAME-<time> on its interval
or at its cron times, skips a start while its last Run still runs (overlap skip), starts none
while paused, and a trigger starts one at once; every input is checked before it reaches
Temporal, and a cron expression is read as Temporal reads it (5, 6 or 7 fields)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from kruntimes.api.phases import TERMINAL_PHASES, RunPhase
from kruntimes.api.run import Run
from kruntimes.contracts.names import SCHEDULED_STAMP, schedule_id
from kruntimes.sdk.client import Client
from kruntimes.sdk.errors import InvalidSchedule, ScheduleAlreadyExists, ScheduleNotFound
from kruntimes.sdk.schedules import check_cron, parse_duration
from kruntimes.temporal.codec import ENCODING
from tests.cli.conftest import krt as krt_cli
from tests.cli.conftest import one_error_line
from tests.sdk.stack import TASK, Platform, manifest, unique
from tests.support.waiting import eventually

BLOCKING = "import time\ndef handle(p):\n    time.sleep(120)\n    return {}\n"


def _task(source: str = TASK) -> Run:
    return Run.from_dict(manifest("template", source=source, mode={"task": {}}, ttlSecondsAfterFinished=300))


async def _eventually(check: Callable[[], Awaitable[bool]], *, within: float, what: str) -> None:
    await eventually(check, within=within, every=0.2, what=what)


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
        # Counted in actions: recentRuns holds only Temporal's last 10.
        handle = (await krt.temporal()).get_schedule_handle(schedule_id("default", name))
        await _delete_all(krt, name)

        async def none_running() -> bool:  # so the overlap policy lets the trigger start
            return not (await handle.describe()).info.running_actions

        await _eventually(none_running, within=20, what="the schedule's last Run to close")
        actions = (await handle.describe()).info.num_actions
        await krt.schedules.trigger(name, "default")  # starts one though paused

        async def triggered() -> bool:
            return (await handle.describe()).info.num_actions > actions

        await _eventually(triggered, within=20, what="the triggered start")
        latest = (await krt.schedules.get(name, "default")).recentRuns[-1]

        async def triggered_run_done() -> bool:
            return any(
                r.metadata.name == latest and r.status.phase is RunPhase.Succeeded
                for r in await _runs_of(krt, name)
            )

        await _eventually(triggered_run_done, within=30, what="the triggered Run")
        # Meanwhile (a Run's whole life, longer than the 2 s interval) the paused schedule started
        # nothing on its own.
        assert (await handle.describe()).info.num_actions == actions + 1
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
    for bad in ("0 3 * *", "every day", "0 3 * * * * * *", "x" * 300, "", "@every 5m"):
        with pytest.raises(InvalidSchedule, match="cron"):
            check_cron(bad)
    # Each refusal names the field and what is wrong with it.
    for bad, why in (
        ("61 * * * *", "minute '61': 61 is out of range 0-59"),
        ("0 24 * * *", "hour '24': 24 is out of range 0-23"),
        ("0 3 0 * *", "day-of-month '0': 0 is out of range 1-31"),
        ("0 3 * 13 *", "month '13': 13 is out of range 1-12"),
        ("0 3 * * 8", "day-of-week '8': 8 is out of range 0-7"),
        ("0 3 * * * 1999", "year '1999': 1999 is out of range 2000-2100"),
        ("60 * * * * * *", "second '60': 60 is out of range 0-59"),
        ("*/0 * * * *", "minute '*/0': the step '0' is not a whole number of at least 1"),
        ("5-2 * * * *", "minute '5-2': the range '5-2' must run upwards"),
        ("0 3 ? * *", "day-of-month '?': '?' is not a number"),  # Quartz's ?, L, W, # are not cron here
        ("0 3 L * *", "day-of-month 'L'"),
        ("0 3 * * 1#2", "day-of-week '1#2': '1#2' is not a number or a name"),
        ("0 12 * * sat-sun", "day-of-week 'sat-sun': the range 'sat-sun' must run upwards"),  # 6 to 0
        ("0 3 * ja *", "month 'ja': 'ja' is not a number or a name"),  # a month name: 3 letters at least
        ("0 \u00b2 * * *", "hour '\u00b2': '\u00b2' is not a number"),  # a digit of another script
        ("1,,2 * * * *", "minute '1,,2'"),
    ):
        with pytest.raises(InvalidSchedule, match="not a cron expression") as refused:
            check_cron(bad)
        assert why in str(refused.value), (bad, str(refused.value))
    assert check_cron(" 0  3 * * 1-5 ") == "0 3 * * 1-5" and check_cron("@hourly") == "@hourly"
    assert (
        check_cron("*/2 * * * * * *") == "*/2 * * * * * *"
        and check_cron("0 3 * * * 2030") == "0 3 * * * 2030"
    )
    assert parse_duration("1h30m") == timedelta(minutes=90) and parse_duration("45") == timedelta(seconds=45)
    for bad in ("0s", "400d", "5 minutes", "", "-3s"):
        with pytest.raises(InvalidSchedule):
            parse_duration(bad)
    with pytest.raises(InvalidSchedule, match=r"^interval 43200000 s: must be within 1 s and 366 days$"):
        parse_duration("500d")
    every = timedelta(minutes=5)
    with pytest.raises(InvalidSchedule, match="DNS"):
        await krt.schedules.create("Bad_Name", _task(), namespace="default", every=every)
    with pytest.raises(InvalidSchedule, match="at most"):
        await krt.schedules.create("n" * 50, _task(), namespace="default", every=every)
    with pytest.raises(InvalidSchedule, match="task Run"):
        await krt.schedules.create("fn", Run.from_dict(manifest("fn")), namespace="default", every=every)
    with pytest.raises(InvalidSchedule, match="overlap 'sometimes': one of skip, buffer-one, allow-all"):
        await krt.schedules.create("o", _task(), namespace="default", every=every, overlap="sometimes")  # type: ignore[arg-type]
    with pytest.raises(InvalidSchedule, match="DNS"):
        await krt.schedules.create("ok", _task(), namespace="Bad_Namespace", every=every)
    with pytest.raises(InvalidSchedule, match="exactly one"):
        await krt.schedules.create("both", _task(), namespace="default", every=every, cron="@daily")
    with pytest.raises(InvalidSchedule, match="minute '99'"):  # refused before it reaches Temporal
        await krt.schedules.create(unique("late"), _task(), namespace="default", cron="99 3 * * *")
    with pytest.raises(ScheduleNotFound):
        await krt.schedules.pause("no-such-schedule", "default")


async def test_krt_schedule_create_list_and_a_bad_cron(platform: Platform, tmp_path: Path) -> None:
    name = unique("cli")
    task = tmp_path / "task.yaml"
    task.write_text(yaml.safe_dump(manifest("template", source=TASK, mode={"task": {}})))
    bad = await krt_cli(platform, "schedule", "create", name, "--cron", "0 3 * *", "-f", str(task))
    assert bad.code == 2 and "not a cron expression" in one_error_line(bad.err)
    late = await krt_cli(platform, "schedule", "create", name, "--cron", "0 25 * * *", "-f", str(task))
    assert late.code == 2 and "hour '25': 25 is out of range 0-23" in one_error_line(late.err)
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


def _stamp(run_name: str, schedule: str) -> datetime:
    return datetime.strptime(run_name.removeprefix(f"{schedule}-"), SCHEDULED_STAMP).replace(tzinfo=UTC)


async def test_a_cron_schedule_with_seconds_starts_runs_at_its_cron_times(
    krt: Client, platform: Platform, tmp_path: Path
) -> None:
    """`*/2 * * * * * *` (7 fields: second first, year last) fires on every even second: each
    Run it starts is named after its cron time, and there is no Run at any other time."""
    name = unique("cron")
    task = tmp_path / "task.yaml"
    task.write_text(
        yaml.safe_dump(manifest("template", source=TASK, mode={"task": {}}, ttlSecondsAfterFinished=300))
    )
    made = await krt_cli(platform, "schedule", "create", name, "--cron", "*/2 * * * * * *", "-f", str(task))
    assert (made.code, made.out) == (0, f"schedule/{name} created\n"), made.err
    try:
        view = await krt.schedules.get(name, "default")
        assert view.cron == "*/2 * * * * * *" and view.nextTimes
        assert all(t.second % 2 == 0 and t.microsecond == 0 for t in view.nextTimes), view.nextTimes

        async def two_succeeded() -> bool:
            runs = await _runs_of(krt, name)
            return sum(1 for r in runs if r.status.phase is RunPhase.Succeeded) >= 2

        await _eventually(two_succeeded, within=60, what="two Runs at the schedule's cron times")
        runs = await _runs_of(krt, name)
        stamps = sorted(_stamp(r.metadata.name, name) for r in runs)
        assert all(s.second % 2 == 0 for s in stamps), [r.metadata.name for r in runs]
        assert len(set(stamps)) == len(stamps) and len({r.uid for r in runs}) == len(runs)
        listed = await krt_cli(platform, "schedule", "list")
        assert listed.code == 0 and "*/2 * * * * * *" in listed.out, listed.err
        # Each start's ScheduledRunWorkflow has its summary, stored as plain text.
        query = f"WorkflowType='ScheduledRunWorkflow' AND WorkflowId STARTS_WITH 'scheduled/default/{name}-'"

        async def listed_starts() -> bool:
            return bool([w async for w in platform.temporal.list_workflows(query)])

        await _eventually(listed_starts, within=20, what="the starts in the visibility store")
        started = [w async for w in platform.temporal.list_workflows(query)]
        described = await platform.temporal.get_workflow_handle(
            started[0].id, run_id=started[0].run_id
        ).describe()
        assert await described.static_summary() == f"schedule default/{name}: task python"
        metadata = described.raw_description.execution_config.user_metadata.summary.metadata
        assert dict(metadata) == {"encoding": b"json/plain"}
    finally:
        await krt.schedules.delete(name, "default")
        await _delete_all(krt, name)


async def test_cron_fields_are_read_as_temporal_reads_them(krt: Client) -> None:
    """5 fields: minute hour day-of-month month day-of-week; 6: and a year; 7: a second first.
    Temporal accepts each form the check accepts, and its next times are what the fields say."""
    forms = {
        "0 3 * * *": lambda t: (t.hour, t.minute, t.second) == (3, 0, 0),
        "15 4 2 mar * 2099": lambda t: t == datetime(2099, 3, 2, 4, 15, tzinfo=UTC),
        "30 15 4 2 3 * 2099": lambda t: t == datetime(2099, 3, 2, 4, 15, 30, tzinfo=UTC),
        "0 12 * * sat,sun": lambda t: t.weekday() >= 5 and (t.hour, t.minute) == (12, 0),
        "5/20 0 1,15 * *": lambda t: t.minute in (5, 25, 45) and t.hour == 0 and t.day in (1, 15),
        "0 3 * * mon-fri": lambda t: t.weekday() < 5 and (t.hour, t.minute) == (3, 0),
        "0 3 1 jan * 2099": lambda t: t == datetime(2099, 1, 1, 3, tzinfo=UTC),
        "0 0 * * 7": lambda t: t.weekday() == 6,  # 7 is Sunday, as 0 is
        "@monthly": lambda t: (t.day, t.hour, t.minute, t.second) == (1, 0, 0, 0),
    }
    made = []
    try:
        for expression, holds in forms.items():
            name = unique("form")
            await krt.schedules.create(name, _task(), namespace="default", cron=expression, paused=True)
            made.append(name)
            view = await krt.schedules.get(name, "default")
            assert view.cron == expression and view.nextTimes, (expression, view)
            assert all(holds(t) for t in view.nextTimes), (expression, view.nextTimes)
    finally:
        for name in made:
            await krt.schedules.delete(name, "default")


async def test_a_schedules_action_keeps_the_runs_env_values_encrypted(
    krt: Client, platform: Platform
) -> None:
    """The schedule holds the task Run it starts, env values included: Temporal stores it through
    the payload codec, so neither the schedule's description nor its memo shows a value."""
    name = unique("secret")
    secret = "s3cr3t-" + unique("v")
    run = Run.from_dict(
        manifest(
            "template",
            source=TASK,
            mode={"task": {}},
            env={"DB_PASSWORD": secret},
            ttlSecondsAfterFinished=300,
        )
    )
    await krt.schedules.create(name, run, namespace="default", cron="0 3 * * *", paused=True)
    try:
        raw = (
            await platform.temporal.get_schedule_handle(schedule_id("default", name)).describe()
        ).raw_description
        start = raw.schedule.action.start_workflow
        assert start.input.payloads and all(p.metadata["encoding"] == ENCODING for p in start.input.payloads)
        assert secret.encode() not in raw.SerializeToString()
        assert b"DB_PASSWORD" not in raw.SerializeToString(), "not even the env name is in plain text"
        assert (await krt.schedules.get(name, "default")).runtime == "python", "decoded through the codec"
    finally:
        await krt.schedules.delete(name, "default")
