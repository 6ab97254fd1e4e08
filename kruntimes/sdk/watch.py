"""The history watcher `wait` sleeps on: a Run's status changes only when one of its workflow
tasks completes, so `wait` long-polls the Run's history and queries the status after each (or,
`phases_only`, after each task that indexed a new phase: every phase a Run stays in beyond one
task is indexed, KrtPhase, in the task that entered it)."""

from __future__ import annotations

import asyncio
from typing import Any

# The pause before polling again once the history has ended (or the long poll failed).
POLL_INTERVAL_S = 0.1


class TaskWatch:
    """The next completed workflow task (or the close) of a Run, by long-polling its history."""

    def __init__(self, handle: Any, *, after: int, phases_only: bool = False) -> None:
        self.after = after  # events up to this id were there already
        self.phases_only = phases_only
        self.events = handle.fetch_history_events(wait_new_event=True).__aiter__()
        self.ended = False  # the history ended (closed, or continued as new): watch the next run anew

    async def next(self) -> None:
        from temporalio.api.enums.v1 import EventType

        from kruntimes.wire import search

        while True:
            try:
                event = await self.events.__anext__()
            except StopAsyncIteration:  # the workflow closed
                self.ended = True
                await asyncio.sleep(POLL_INTERVAL_S)
                return
            if event.event_id <= self.after:
                continue
            self.after = event.event_id
            if self.phases_only:
                upserted = event.upsert_workflow_search_attributes_event_attributes.search_attributes
                if (
                    event.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
                    and search.PHASE in upserted.indexed_fields
                ):
                    return
            elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                return


class PhaseWatch:
    """A Run's history from its first event, then long-polled: the event that started it (its
    manifest and start time) and each phase it indexed (its KrtPhase upserts), in order. Read
    from the start, nothing that happened before the watch began can be missed."""

    def __init__(self, handle: Any) -> None:
        self.events = handle.fetch_history_events(wait_new_event=True).__aiter__()
        self.started: Any = None  # the WorkflowExecutionStarted event, once read
        # The status the Run wrote (its STATUS_MEMO payload, still encoded) with the phase `next`
        # returned last: the memo upsert right before that phase's upsert, else None.
        self.status: Any = None
        self._memo: tuple[int, Any] | None = None  # (event id, payload) of the last status memo

    async def next(self) -> str | None:
        """The next phase the Run indexed (a RunPhase's value, or Deleted); None once its
        history has ended (it closed, or continued as new)."""
        from temporalio.api.enums.v1 import EventType
        from temporalio.converter import PayloadConverter

        from kruntimes.contracts.run import STATUS_MEMO
        from kruntimes.wire import search

        self.status = None
        while True:
            try:
                event = await self.events.__anext__()
            except StopAsyncIteration:
                return None
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                self.started = event
            elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED:
                memo = event.workflow_properties_modified_event_attributes.upserted_memo.fields
                if STATUS_MEMO in memo:
                    self._memo = (event.event_id, memo[STATUS_MEMO])
            elif event.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
                fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes
                if search.PHASE in fields.indexed_fields:
                    value = PayloadConverter.default.from_payload(fields.indexed_fields[search.PHASE])
                    if self._memo is not None and self._memo[0] == event.event_id - 1:
                        self.status = self._memo[1]
                    return str(value[0] if isinstance(value, list) and value else value)
