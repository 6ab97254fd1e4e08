"""The decisions of a Function's workflow, as pure functions (FunctionWorkflow calls them).

- which replicas to start and which to delete (`plan`): keep `wanted` replicas of the current
  revision; delete the older revisions' only once `wanted` of the current one are Ready (a
  rollout never takes away what serves before its replacement serves); delete a surplus of the
  current revision, the ones not Ready and the newest first;
- how long to wait before starting a replica again after replicas ended before ever being
  Ready (`start_backoff`): a broken template does not start Runs in a hot loop;
- the Function's phase (`phase_of`).

Nothing here reads a clock or does I/O: the workflow passes `workflow.now()` in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from kruntimes.api.function import FunctionPhase
from kruntimes.api.phases import TERMINAL_PHASES, RunPhase
from kruntimes.contracts.function import Replica

# The backoff between replica starts after failures: doubled from the first, at most the last.
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 300.0


def start_backoff(failures: int) -> float:
    """Seconds before the next replica start after `failures` replicas in a row ended before
    Ready (1-based): FIRST_BACKOFF_S doubled each time, at most MAX_BACKOFF_S."""
    if failures < 1:
        raise ValueError(f"failures count from 1, not {failures}")
    return min(FIRST_BACKOFF_S * 2.0 ** min(failures - 1, 30), MAX_BACKOFF_S)


@dataclass(frozen=True)
class Plan:
    start: int  # replicas of the current revision to start now
    delete: tuple[str, ...]  # run uids of replicas to delete
    # The current revision has `wanted` Ready replicas: the rollout to it is done.
    rolled_out: bool


def _live(replicas: Sequence[Replica]) -> list[Replica]:
    return [r for r in replicas if not r.deleting and r.phase not in TERMINAL_PHASES]


def ended(replica: Replica) -> bool:
    return replica.phase in TERMINAL_PHASES


def plan(
    *, revision: int, wanted: int, replicas: Sequence[Replica], now: datetime, retry_at: datetime | None
) -> Plan:
    """What to start and delete for `wanted` replicas of `revision` (`replicas`: every replica
    the Function keeps, in the order started; `retry_at`: no start before it)."""
    if wanted < 0:
        raise ValueError(f"wanted replicas cannot be negative: {wanted}")
    live = _live(replicas)
    current = [r for r in live if r.revision == revision]
    ready = [r for r in current if r.phase is RunPhase.Ready]
    rolled_out = len(ready) >= wanted
    delete: list[str] = []
    if len(current) > wanted:
        # Keep the Ready ones, the oldest first: the surplus is the not-Ready, then the newest.
        order = {r.runUid: i for i, r in enumerate(current)}
        keep = sorted(current, key=lambda r: (r.phase is not RunPhase.Ready, order[r.runUid]))
        delete += [r.runUid for r in keep[wanted:]]
    if rolled_out:
        delete += [r.runUid for r in live if r.revision != revision]
    may_start = retry_at is None or now >= retry_at
    start = max(wanted - len(current), 0) if may_start else 0
    return Plan(start=start, delete=tuple(delete), rolled_out=rolled_out)


def phase_of(*, wanted: int, replicas: Sequence[Replica], deleting: bool, ever_ready: bool) -> FunctionPhase:
    """Deleting while its replicas go; Ready when `wanted` replicas are Ready (of any revision:
    during a rollout the old ones serve); when fewer are, Degraded once the Function was Ready
    (`ever_ready`), else Pending (coming up)."""
    if deleting:
        return FunctionPhase.Deleting
    ready = sum(1 for r in _live(replicas) if r.phase is RunPhase.Ready)
    if ready >= wanted:
        return FunctionPhase.Ready
    if ever_ready:
        return FunctionPhase.Degraded
    return FunctionPhase.Pending
