"""A Run's events, read from its workflow history: each phase it entered (with the status it wrote
then: reason, message, host, attempt), the host calls it made and how they failed, the signals and
Updates it took. What `krt run describe` shows under Events.

Nothing here is secret: a status is what `krt run get` shows, a host call is named by its plain
summary, and a failed one by its failure's type (its message may quote the handler's env and stays
encrypted).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kruntimes.api.status import ConditionType, RunStatus

# The events kept: the newest ones, as kubectl keeps a Pod's recent events.
MAX_EVENTS = 50


@dataclass(frozen=True)
class RunEvent:
    at: datetime
    kind: str  # Phase | HostCall | HostCallFailed | Signal | Update | ContinuedAsNew
    reason: str  # the phase's reason, a failure's type, a signal's or Update's name
    message: str = ""
    host: str = ""
    attempt: int | None = None


async def read_events(handle: Any, client: Any) -> list[RunEvent]:
    """The events of the workflow `handle` (its current run's history), oldest first."""
    from temporalio.api.enums.v1 import EventType as T
    from temporalio.converter import PayloadConverter

    from kruntimes.contracts.run import STATUS_MEMO
    from kruntimes.wire import search

    events: list[RunEvent] = []
    memos: dict[int, Any] = {}  # index in events → the encoded status the Run wrote with that phase
    memo: tuple[int, Any] | None = None
    scheduled: dict[int, str] = {}  # activity scheduled event id → its summary
    async for event in handle.fetch_history_events():
        at = event.event_time.ToDatetime(tzinfo=UTC)
        kind = event.event_type
        if kind == T.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED:
            fields = event.workflow_properties_modified_event_attributes.upserted_memo.fields
            if STATUS_MEMO in fields:
                memo = (event.event_id, fields[STATUS_MEMO])
        elif kind == T.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            indexed = (
                event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
            )
            if search.PHASE in indexed:
                value = PayloadConverter.default.from_payload(indexed[search.PHASE])
                phase = str(value[0] if isinstance(value, list) and value else value)
                if memo is not None and memo[0] == event.event_id - 1:
                    memos[len(events)] = memo[1]
                events.append(RunEvent(at, "Phase", phase))
        elif kind == T.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            summary = await _summary(event, client) or name
            scheduled[event.event_id] = summary
            events.append(RunEvent(at, "HostCall", name, summary))
        elif kind in (T.EVENT_TYPE_ACTIVITY_TASK_FAILED, T.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT):
            attributes = (
                event.activity_task_failed_event_attributes
                if kind == T.EVENT_TYPE_ACTIVITY_TASK_FAILED
                else event.activity_task_timed_out_event_attributes
            )
            events.append(
                RunEvent(
                    at,
                    "HostCallFailed",
                    _failure_type(attributes.failure),
                    scheduled.get(attributes.scheduled_event_id, ""),
                )
            )
        elif kind == T.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            events.append(
                RunEvent(at, "Signal", event.workflow_execution_signaled_event_attributes.signal_name)
            )
        elif kind == T.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            request = event.workflow_execution_update_accepted_event_attributes.accepted_request
            events.append(RunEvent(at, "Update", request.input.name))
        elif kind == T.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            events.append(RunEvent(at, "ContinuedAsNew", "ContinuedAsNew"))
    if memos:
        order = sorted(memos)
        try:
            statuses = await client.data_converter.decode([memos[i] for i in order], [RunStatus] * len(order))
        except Exception:  # a status this client cannot decode (no key): the phases stay bare
            statuses = []
        for i, status in zip(order, statuses, strict=False):
            if isinstance(status, RunStatus):
                events[i] = _with_status(events[i], status)
    return events[-MAX_EVENTS:]


def _with_status(event: RunEvent, status: RunStatus) -> RunEvent:
    ready = status.condition(ConditionType.Ready)
    return RunEvent(
        event.at,
        event.kind,
        ready.reason if ready is not None else event.reason,
        status.message,
        status.assignedHost or "",
        status.attempt,
    )


async def _summary(event: Any, client: Any) -> str:
    if not event.HasField("user_metadata") or not event.user_metadata.HasField("summary"):
        return ""
    try:
        [text] = await client.data_converter.decode([event.user_metadata.summary], [str])
    except Exception:  # not plain text: the activity's name says enough
        return ""
    return str(text)


def _failure_type(failure: Any) -> str:
    """The failure's type (the reason; else its first cause's that has one), never its message."""
    while not failure.HasField("application_failure_info") and failure.HasField("cause"):
        failure = failure.cause
    if failure.HasField("application_failure_info") and failure.application_failure_info.type:
        return str(failure.application_failure_info.type)
    if failure.HasField("timeout_failure_info"):
        return "Timeout"
    if failure.HasField("canceled_failure_info"):
        return "Cancelled"
    return "Failed"
