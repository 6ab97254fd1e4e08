"""Schedules: a task Run started on a Temporal Schedule (`schedule/{namespace}/{name}`), by cron
expression or fixed interval, durable and visible in the Temporal UI's Schedules page.

Each start is one ScheduledRunWorkflow (`scheduled/{namespace}/{name}-<time>`), which creates
the task Run `<name>-<scheduled time>` (e.g. `nightly-20250101120000`) and closes as it does,
so the overlap policy counts Runs: `skip` (the default) starts none while the last one runs,
`buffer-one` keeps one start for after it, `allow-all` starts every time. A trigger starts one
now (under the same overlap policy), paused or not.

Everything given is validated before it reaches Temporal: the name (a DNS label short enough to
leave room for the time stamp), the namespace, the cron expression (5, 6 or 7 fields, each value
within its field's bounds, as Temporal reads them; Temporal's own refusal is passed on too), the
interval's bounds, the template (a task Run).
"""

from __future__ import annotations

import builtins
import re
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from kruntimes.api.ids import Namespace
from kruntimes.api.names import validate_dns1123_label
from kruntimes.api.run import Run
from kruntimes.api.spec import Creator
from kruntimes.contracts.names import (
    MAX_SCHEDULE_NAME,
    schedule_id,
    scheduled_run_name,
    scheduled_workflow_id,
)
from kruntimes.contracts.scheduled import ScheduledRunInput
from kruntimes.sdk.errors import InvalidSchedule, ScheduleAlreadyExists, ScheduleNotFound

if TYPE_CHECKING:
    from kruntimes.sdk.runs import Runs

Overlap = Literal["skip", "buffer-one", "allow-all"]
OVERLAPS: tuple[Overlap, ...] = ("skip", "buffer-one", "allow-all")
MIN_INTERVAL = timedelta(seconds=1)
MAX_INTERVAL = timedelta(days=366)
MAX_CRON_LENGTH = 200
MAX_NOTE_LENGTH = 500
_CRON_MACROS = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_PREFIX = "schedule/"
CRON_MEMO = "krtCron"


class ScheduleView(NamedTuple):
    """One schedule as `krt schedule get` shows it."""

    name: str
    namespace: str
    cron: str | None  # one of cron and every is set
    every: timedelta | None
    overlap: Overlap
    paused: bool
    note: str
    runtime: str
    recentRuns: builtins.list[str]  # the Runs it started lately, oldest first
    nextTimes: builtins.list[datetime]
    skippedOverlap: int  # starts skipped because the last Run still ran

    def document(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "namespace": self.namespace,
            "cron": self.cron,
            "every": f"{self.every.total_seconds():g}s" if self.every is not None else None,
            "overlap": self.overlap,
            "paused": self.paused,
            "note": self.note,
            "runtime": self.runtime,
            "recentRuns": self.recentRuns,
            "nextTimes": [t.isoformat() for t in self.nextTimes],
            "skippedOverlap": self.skippedOverlap,
        }


def parse_duration(text: str) -> timedelta:
    """`90s`, `5m`, `1h30m`, `2d` (or plain seconds) within MIN_INTERVAL..MAX_INTERVAL."""
    text = text.strip()
    if text.isdigit():
        every = timedelta(seconds=int(text))
    else:
        match = _DURATION.match(text)
        if not text or match is None:
            raise InvalidSchedule(f"--every {text!r}: not a duration (e.g. 30s, 5m, 1h30m, 2d)")
        days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
        every = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    return check_interval(every)


def check_interval(every: timedelta) -> timedelta:
    if not MIN_INTERVAL <= every <= MAX_INTERVAL:
        seconds = f"{every.total_seconds():.3f}".rstrip("0").rstrip(".")  # 43200000, 0.5
        raise InvalidSchedule(
            f"interval {seconds} s: must be within {MIN_INTERVAL.total_seconds():g} s"
            f" and {MAX_INTERVAL.days} days"
        )
    return every


def check_cron(expression: str) -> str:
    """A cron expression as Temporal reads it (UTC): a macro (@hourly, @daily, ...) or 5, 6 or 7
    fields: `minute hour day-of-month month day-of-week`, then `year` (6 fields), with `second`
    first as well (7 fields; e.g. `*/30 * * * * * *` is every 30 s). Each field is `*`, a value,
    a range `a-b`, any of those with a step `/n`, or a comma list of them; months and days of the
    week may be names (`jan`, `mon`). Every value is checked against its field's bounds here, so a
    refusal says which field is wrong; Temporal's own refusal is passed on as well."""
    text = " ".join(expression.split())
    if len(text) > MAX_CRON_LENGTH:
        raise InvalidSchedule(f"cron expression longer than {MAX_CRON_LENGTH} characters")
    if text in _CRON_MACROS:
        return text
    fields = text.split(" ") if text else []
    names = _CRON_LAYOUTS.get(len(fields))
    if names is None:
        raise InvalidSchedule(
            f"--cron {expression!r}: not a cron expression: want 5 fields (minute hour day-of-month "
            "month day-of-week, e.g. '0 3 * * *'), 6 (the same and a year) or 7 (a second first, "
            "e.g. '*/30 * * * * * *'), or @hourly, @daily, @weekly, @monthly, @yearly"
        )
    for field, name in zip(fields, names, strict=True):
        problem = _cron_field_problem(field, name)
        if problem is not None:
            raise InvalidSchedule(
                f"--cron {expression!r}: not a cron expression: {name} {field!r}: {problem}"
            )
    return text


_CRON_FIVE = ("minute", "hour", "day-of-month", "month", "day-of-week")
_CRON_LAYOUTS = {5: _CRON_FIVE, 6: (*_CRON_FIVE, "year"), 7: ("second", *_CRON_FIVE, "year")}
_CRON_BOUNDS = {
    "second": (0, 59),
    "minute": (0, 59),
    "hour": (0, 23),
    "day-of-month": (1, 31),
    "month": (1, 12),
    "day-of-week": (0, 7),  # 0 and 7 are Sunday
    "year": (2000, 2100),  # the years Temporal's calendar knows
}
_MONTHS = (
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
)
_DAYS = ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")


def _cron_value(text: str, name: str) -> int | None:
    """A field's value: a decimal number, or a name as Temporal reads it (a month's first three
    or more letters, a day's first two or more); None if it is neither."""
    lowered = text.lower()
    if name == "month" and len(lowered) >= 3:
        for number, month in enumerate(_MONTHS, start=1):
            if month.startswith(lowered):
                return number
    if name == "day-of-week" and len(lowered) >= 2:
        for number, day in enumerate(_DAYS):
            if day.startswith(lowered):
                return number
    return int(text) if _digits(text) else None


def _digits(text: str) -> bool:
    """One to four ASCII digits (str.isdigit alone takes other scripts' digits too)."""
    return 1 <= len(text) <= 4 and text.isascii() and text.isdigit()


def _cron_field_problem(field: str, name: str) -> str | None:
    """Why one cron field is not one Temporal accepts (None when it is)."""
    low, high = _CRON_BOUNDS[name]
    for part in field.split(","):
        base, slash, step = part.partition("/")
        if slash and not (_digits(step) and int(step) >= 1):
            return f"the step {step!r} is not a whole number of at least 1"
        if base == "*":
            continue
        start_text, dash, end_text = base.partition("-")
        start = _cron_value(start_text, name)
        if start is None:
            return _not_a_value(start_text, name)
        if not low <= start <= high:
            return f"{start} is out of range {low}-{high}"
        if dash:
            end = _cron_value(end_text, name)
            if end is None:
                return _not_a_value(end_text, name)
            if not start <= end <= high:
                return f"the range {base!r} must run upwards within {low}-{high}"
    return None


def _not_a_value(text: str, field: str) -> str:
    return f"{text!r} is not a number" + (" or a name" if field in ("month", "day-of-week") else "")


def check_name(name: str, namespace: str) -> None:
    try:
        validate_dns1123_label(name, field="schedule name")
        validate_dns1123_label(namespace, field="namespace")
    except ValueError as e:
        raise InvalidSchedule(str(e)) from e
    if len(name) > MAX_SCHEDULE_NAME:
        raise InvalidSchedule(
            f"schedule name {name!r}: at most {MAX_SCHEDULE_NAME} characters (its Runs are named "
            f"{name}-<yyyymmddhhmmss>, a Run name at most 63)"
        )


def template_of(run: Run, *, name: str, namespace: str, creator: Creator | None = None) -> Run:
    """What each start creates: the task Run named after the schedule, without a uid; its Runs'
    creator is `creator` (the schedule, for the identity that created it)."""
    if run.spec.mode.kind != "task":
        raise InvalidSchedule(f"schedule {name!r}: the manifest must be a task Run (spec.mode.task)")
    from kruntimes.sdk.runs import prepare

    prepared = prepare(run, creator=creator)  # an absolute source path
    metadata = prepared.metadata._replace(name=name, namespace=namespace, uid=None)
    return prepared._replace(metadata=metadata)


class Schedules:
    def __init__(self, runs: Runs) -> None:
        self._runs = runs

    async def _call(self, call: Any, *, namespace: str, name: str) -> Any:
        from temporalio.client import ScheduleAlreadyRunningError
        from temporalio.service import RPCError, RPCStatusCode

        try:
            return await call
        except ScheduleAlreadyRunningError as e:
            raise ScheduleAlreadyExists(namespace, name) from e
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                raise ScheduleNotFound(namespace, name) from e
            if e.status == RPCStatusCode.ALREADY_EXISTS:
                raise ScheduleAlreadyExists(namespace, name) from e
            if e.status == RPCStatusCode.INVALID_ARGUMENT:
                raise InvalidSchedule(f"schedule {name!r}: Temporal refused it: {e.message}") from e
            return await self._runs._rpc(_raise(e), namespace=namespace, name=name)

    async def _handle(self, name: str, namespace: str) -> Any:
        try:
            check_name(name, namespace)
        except InvalidSchedule as e:
            raise ScheduleNotFound(namespace, name) from e
        client = await self._runs.temporal()
        return client.get_schedule_handle(schedule_id(Namespace(namespace), name))

    async def create(
        self,
        name: str,
        run: Run,
        *,
        namespace: str,
        cron: str | None = None,
        every: timedelta | None = None,
        overlap: Overlap = "skip",
        paused: bool = False,
        note: str = "",
    ) -> ScheduleView:
        """A schedule starting the task Run `run` (its name and uid are the schedule's to set)
        on `cron` or `every`; ScheduleAlreadyExists if one of that name exists."""
        from temporalio.client import (
            Schedule,
            ScheduleActionStartWorkflow,
            ScheduleIntervalSpec,
            SchedulePolicy,
            ScheduleSpec,
            ScheduleState,
        )

        from kruntimes.sdk.runtimes import check_runtime
        from kruntimes.wire import summaries

        check_name(name, namespace)
        if (cron is None) == (every is None):
            raise InvalidSchedule(f"schedule {name!r}: give exactly one of a cron expression and an interval")
        if overlap not in OVERLAPS:
            raise InvalidSchedule(f"overlap {overlap!r}: one of {', '.join(OVERLAPS)}")
        if len(note) > MAX_NOTE_LENGTH:
            raise InvalidSchedule(f"note longer than {MAX_NOTE_LENGTH} characters")
        template = template_of(run, name=name, namespace=namespace, creator=self._runs.creator("schedule"))
        if cron is not None:
            spec = ScheduleSpec(cron_expressions=[check_cron(cron)])
        else:
            assert every is not None
            spec = ScheduleSpec(intervals=[ScheduleIntervalSpec(every=check_interval(every))])
        action = ScheduleActionStartWorkflow(
            "ScheduledRunWorkflow",
            ScheduledRunInput(run=template, schedule=name),
            id=scheduled_workflow_id(Namespace(namespace), name),
            task_queue=self._runs.config.taskQueue,
            static_summary=summaries.summary(f"schedule {namespace}/{name}: task {template.spec.runtime}"),
        )
        schedule = Schedule(
            action=action,
            spec=spec,
            policy=SchedulePolicy(overlap=_OVERLAP_POLICY()[overlap]),
            state=ScheduleState(paused=paused, note=note),
        )
        client = await self._runs.temporal()
        await self._runs._rpc(check_runtime(client, template.spec.runtime), namespace=namespace, name=name)
        # The server keeps a cron expression as calendars: the memo keeps it as given.
        memo = {CRON_MEMO: spec.cron_expressions[0]} if spec.cron_expressions else None
        await self._call(
            client.create_schedule(schedule_id(Namespace(namespace), name), schedule, memo=memo),
            namespace=namespace,
            name=name,
        )
        return await self.get(name, namespace)

    async def get(self, name: str, namespace: str) -> ScheduleView:
        handle = await self._handle(name, namespace)
        description = await self._call(handle.describe(), namespace=namespace, name=name)
        runtime = ""
        args = getattr(description.schedule.action, "args", None) or []
        if args:  # described actions hold their arguments encoded
            client = await self._runs.temporal()
            try:
                [started] = await client.data_converter.decode(args, [ScheduledRunInput])
                runtime = started.run.spec.runtime
            except Exception:  # not one of ours: shown without a runtime
                runtime = ""
        memo = await description.memo()
        cron = memo.get(CRON_MEMO) if isinstance(memo, dict) else None
        view = _view(description, name=name, namespace=namespace, runtime=runtime)
        return view._replace(cron=str(cron)) if cron else view

    async def list(self, namespace: str | None) -> builtins.list[ScheduleView]:
        """Every schedule of one namespace (or all), by name."""
        client = await self._runs.temporal()
        found: builtins.list[tuple[str, str]] = []

        async def collect() -> None:
            async for entry in await client.list_schedules():
                parts = entry.id.split("/")
                if len(parts) == 3 and entry.id.startswith(_PREFIX) and namespace in (None, parts[1]):
                    found.append((parts[1], parts[2]))

        await self._call(collect(), namespace=namespace or "*", name="*")
        views = []
        for ns, name in sorted(found):
            try:
                views.append(await self.get(name, ns))
            except ScheduleNotFound:
                continue  # deleted meanwhile
        return views

    async def pause(self, name: str, namespace: str, *, note: str = "") -> None:
        handle = await self._handle(name, namespace)
        await self._call(handle.pause(note=_note(note, "paused by krt")), namespace=namespace, name=name)

    async def unpause(self, name: str, namespace: str, *, note: str = "") -> None:
        handle = await self._handle(name, namespace)
        await self._call(handle.unpause(note=_note(note, "unpaused by krt")), namespace=namespace, name=name)

    async def trigger(self, name: str, namespace: str) -> None:
        """Start one Run now (the schedule's overlap policy applies), paused or not."""
        handle = await self._handle(name, namespace)
        await self._call(handle.trigger(), namespace=namespace, name=name)

    async def delete(self, name: str, namespace: str) -> None:
        """Delete the schedule; the Runs it started are left as they are."""
        handle = await self._handle(name, namespace)
        await self._call(handle.delete(), namespace=namespace, name=name)


async def _raise(error: BaseException) -> None:
    raise error


def _note(note: str, default: str) -> str:
    if len(note) > MAX_NOTE_LENGTH:
        raise InvalidSchedule(f"note longer than {MAX_NOTE_LENGTH} characters")
    return note or default


def _OVERLAP_POLICY() -> dict[Overlap, Any]:
    from temporalio.client import ScheduleOverlapPolicy

    return {
        "skip": ScheduleOverlapPolicy.SKIP,
        "buffer-one": ScheduleOverlapPolicy.BUFFER_ONE,
        "allow-all": ScheduleOverlapPolicy.ALLOW_ALL,
    }


def _view(description: Any, *, name: str, namespace: str, runtime: str) -> ScheduleView:
    schedule = description.schedule
    spec = schedule.spec
    cron = spec.cron_expressions[0] if spec.cron_expressions else None
    every = spec.intervals[0].every if spec.intervals else None
    policies: dict[Any, Overlap] = {v: k for k, v in _OVERLAP_POLICY().items()}
    policy = policies.get(schedule.policy.overlap, "skip")
    info = description.info
    return ScheduleView(
        name=name,
        namespace=namespace,
        cron=cron,
        every=every,
        overlap=policy,
        paused=schedule.state.paused,
        note=schedule.state.note or "",
        runtime=runtime,
        recentRuns=[scheduled_run_name(name, a.scheduled_at) for a in info.recent_actions],
        nextTimes=list(info.next_action_times),
        skippedOverlap=info.num_actions_skipped_overlap,
    )
