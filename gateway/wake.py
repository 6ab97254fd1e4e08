"""Scale from zero, the gateway's side: a Function's workflow asked for a replica by its `wake`
signal (kruntimes.contracts.names.SIGNAL_FUNCTION_WAKE) when the gateway holds an invocation of a
Function without a Ready replica (gateway/function_invoke.py holds it).

- At most one signal per Function per `interval_s`, however many invocations are held: no storm.
- In the background: the invoke path schedules the signal and waits on the balancer for a Ready
  replica, never on Temporal. At most MAX_SENDING signals are on their way at once; a Function
  whose turn comes while that many are is asked at its next held invocation.
- A signal that was not sent (Temporal unreachable or refusing, the workflow not running) calls
  `on_failed` with the Function's uid: its held invocations end 503 with Retry-After, none lost.

The workflow id is the Function's (`function/{namespace}/{name}`), from the known-Functions view
(kruntimes/temporal/known_functions.py) or the Function's replica routes seen before.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from kruntimes.contracts.names import SIGNAL_FUNCTION_WAKE
from kruntimes.gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)

WAKE_INTERVAL_S = 1.0
MAX_SENDING = 256  # signals on their way at once
MAX_TRACKED = 20_000  # Functions whose last signal is remembered (more than the gateway holds)


class Signaller(Protocol):
    """Sends a signal without an argument (gateway/visibility.py's Visibility)."""

    async def signal(self, workflow_id: str, name: str, *, request_id: str) -> None: ...


class Waker:
    def __init__(
        self,
        signaller: Signaller,
        *,
        interval_s: float = WAKE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.signaller = signaller
        self.metrics = metrics
        self.interval_s = interval_s
        self._clock = clock
        self._last: OrderedDict[str, float] = OrderedDict()  # function uid → its last signal's time
        self._sending: set[asyncio.Task[None]] = set()
        self.on_failed: Callable[[str], None] | None = None
        self.sent = 0  # signals Temporal took
        self.failed = 0  # signals that were not sent

    def wake(self, function_uid: str, workflow_id: str) -> bool:
        """Ask the Function's workflow for a replica, unless it was asked less than `interval_s`
        ago; True if a signal is on its way now."""
        now = self._clock()
        last = self._last.get(function_uid)
        if last is not None and now - last < self.interval_s:
            return False
        if len(self._sending) >= MAX_SENDING:
            return False
        self._last.pop(function_uid, None)  # re-inserted last: the longest unasked go first
        self._last[function_uid] = now
        while len(self._last) > MAX_TRACKED:
            del self._last[next(iter(self._last))]
        task = asyncio.get_running_loop().create_task(self._send(function_uid, workflow_id))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)
        return True

    async def _send(self, function_uid: str, workflow_id: str) -> None:
        try:
            await self.signaller.signal(workflow_id, SIGNAL_FUNCTION_WAKE, request_id=str(uuid.uuid4()))
        except Exception as e:  # whatever it was, the held invocations must not wait on it
            self.failed += 1
            if self.metrics is not None:
                self.metrics.function_wakes.labels("failed").inc()
            log.warning(
                "cannot ask a Function's workflow for a replica",
                extra={"function_uid": function_uid, "error": str(e)[:300]},
            )
            if self.on_failed is not None:
                self.on_failed(function_uid)
            return
        self.sent += 1
        if self.metrics is not None:
            self.metrics.function_wakes.labels("sent").inc()
        log.info("asked a Function's workflow for a replica", extra={"function_uid": function_uid})

    async def stop(self) -> None:
        for task in list(self._sending):
            task.cancel()
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
