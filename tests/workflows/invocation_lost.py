"""Attempt stand-ins whose activity never answers (#44): the attempt's task started and its code
never ran (NEVER_RAN: no heartbeat at all), or it recorded ATTEMPT_SENT the way
attempt_invocation does before it sends and then was lost (SENT_THEN_LOST). Either way the
attempt ends on the workflow's heartbeat timeout. Shared by
tests/workflows/invocation_lost_test.py and tests/replay/record_invocation_lost.py."""

from __future__ import annotations

import asyncio
from enum import Enum

from temporalio import activity

from kruntimes.contracts.invocation import ACTIVITY_ATTEMPT, ATTEMPT_SENT, AttemptOutcome, AttemptRequest
from tests.workflows.invocations import StandIns, _next


class Lost(Enum):
    NEVER_RAN = "never ran"
    SENT_THEN_LOST = "sent, then lost"


# Far beyond the workflow's heartbeat timeout.
SILENT_S = 24 * 3600.0


class LosingStandIns(StandIns):
    """StandIns whose attempts may also be a Lost step."""

    @activity.defn(name=ACTIVITY_ATTEMPT)
    async def attempt_invocation(self, request: AttemptRequest) -> AttemptOutcome:
        script = self.script(request.target.uid)
        script.asked_attempts.append(request)
        step = script.attempts[min(len(script.asked_attempts) - 1, len(script.attempts) - 1)]
        if step is Lost.SENT_THEN_LOST:
            info = activity.info()
            handle = activity.client().get_async_activity_handle(task_token=info.task_token)
            await handle.heartbeat(ATTEMPT_SENT)  # awaited, as the activity marks before it sends
        if isinstance(step, Lost):
            await asyncio.sleep(SILENT_S)  # cancelled when its worker stops
        return _next(script.attempts, len(script.asked_attempts) - 1)  # type: ignore[no-any-return]
