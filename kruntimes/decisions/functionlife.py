"""The decisions of a Function's workflow, as pure functions (FunctionWorkflow calls them).

- which replicas to start and which to delete (`plan`): keep `wanted` replicas of the current
  revision; delete the older revisions' only once `wanted` of the current one are Ready (a
  rollout never takes away what serves before its replacement serves); delete a surplus of the
  current revision, the ones not Ready and the newest first; an older revision a traffic split
  names keeps as many as the split gives it (`older`, `older_replicas`);
- how a traffic split divides the replicas wanted between its revisions (`split_wanted`): a
  canary takes its percent of them instead of adding to them;
- how long to wait before starting a replica again after replicas ended before ever being
  Ready (`start_backoff`): a broken template does not start Runs in a hot loop;
- the Function's phase (`phase_of`).

Nothing here reads a clock or does I/O: the workflow passes `workflow.now()` in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    # (older revision, replicas of it to start now) for the older revisions a split keeps
    start_older: tuple[tuple[int, int], ...] = ()


def older_replicas(wanted: int, percent: int) -> int:
    """Replicas an older revision a traffic split gives `percent` keeps: its share of `wanted`
    (rounded), at least one while its percent is above 0 and the Function has any replica."""
    if percent <= 0 or wanted <= 0:
        return 0
    return max(1, round(wanted * percent / 100))


def split_wanted(wanted: int, split: Mapping[int, int], *, maximum: int) -> dict[int, int]:
    """The replicas each revision of a traffic split (revision → percent) keeps out of `wanted`:
    its percent of them, the largest remainders rounded up (ties: the newer revision) so that
    they add up to `wanted`; at least one for each revision whose percent is above 0 while
    `wanted` is, taken back from the revision with the most (never below one). So the total is
    `wanted` (at most `maximum`), but for the one replica each revision of a split needs to be
    honoured at all (`wanted` 1 with two revisions: 2)."""
    if wanted < 0:
        raise ValueError(f"wanted replicas cannot be negative: {wanted}")
    shares = {revision: wanted * percent // 100 for revision, percent in split.items()}
    if wanted == 0 or not split:
        return shares
    order = sorted(split, key=lambda r: (-(wanted * split[r] % 100), -r))
    left = wanted - sum(shares.values())
    for i in range(max(left, 0)):
        shares[order[i % len(order)]] += 1
    for revision in sorted(split, reverse=True):
        if split[revision] > 0 and shares[revision] == 0:
            shares[revision] = 1
    floor = sum(1 for percent in split.values() if percent > 0)
    total = max(min(wanted, maximum), floor)
    while sum(shares.values()) > total:
        donor = max(shares, key=lambda r: (shares[r], -split[r], -r))
        if shares[donor] <= 1:
            break
        shares[donor] -= 1
    return shares


def _surplus(replicas: Sequence[Replica], keep: int) -> list[str]:
    # Keep the Ready ones, the oldest first: the surplus is the not-Ready, then the newest.
    if len(replicas) <= keep:
        return []
    order = {r.runUid: i for i, r in enumerate(replicas)}
    kept = sorted(replicas, key=lambda r: (r.phase is not RunPhase.Ready, order[r.runUid]))
    return [r.runUid for r in kept[keep:]]


def _live(replicas: Sequence[Replica]) -> list[Replica]:
    return [r for r in replicas if not r.deleting and r.phase not in TERMINAL_PHASES]


def ended(replica: Replica) -> bool:
    return replica.phase in TERMINAL_PHASES


def plan(
    *,
    revision: int,
    wanted: int,
    replicas: Sequence[Replica],
    now: datetime,
    retry_at: datetime | None,
    older: Mapping[int, int] | None = None,
) -> Plan:
    """What to start and delete for `wanted` replicas of `revision` (`replicas`: every replica
    the Function keeps, in the order started; `retry_at`: no start before it; `older`: older
    revisions a traffic split keeps → their replicas, kept rather than deleted once rolled out)."""
    if wanted < 0:
        raise ValueError(f"wanted replicas cannot be negative: {wanted}")
    older = {r: n for r, n in (older or {}).items() if r != revision}
    live = _live(replicas)
    current = [r for r in live if r.revision == revision]
    ready = [r for r in current if r.phase is RunPhase.Ready]
    rolled_out = len(ready) >= wanted
    delete = _surplus(current, wanted)
    if rolled_out:
        delete += [r.runUid for r in live if r.revision != revision and r.revision not in older]
    may_start = retry_at is None or now >= retry_at
    start = max(wanted - len(current), 0) if may_start else 0
    start_older: list[tuple[int, int]] = []
    for rev, keep in sorted(older.items()):
        theirs = [r for r in live if r.revision == rev]
        if rolled_out:  # before, whatever of it serves keeps serving
            delete += _surplus(theirs, keep)
        if may_start and len(theirs) < keep:
            start_older.append((rev, keep - len(theirs)))
    return Plan(start=start, delete=tuple(delete), rolled_out=rolled_out, start_older=tuple(start_older))


def phase_of(
    *, wanted: int, replicas: Sequence[Replica], deleting: bool, ever_ready: bool, failing: bool = False
) -> FunctionPhase:
    """Deleting while its replicas go; Ready when `wanted` replicas are Ready (of any revision:
    during a rollout the old ones serve); when fewer are, Degraded once the Function was Ready
    (`ever_ready`), else Pending (coming up). A Function with no Ready replica whose last replicas
    ended before Ready (`failing`) is not Ready even when none is wanted (scaled to zero): its
    next invocation would wake a replica that fails as they did."""
    if deleting:
        return FunctionPhase.Deleting
    ready = sum(1 for r in _live(replicas) if r.phase is RunPhase.Ready)
    if ready >= wanted and not (failing and ready == 0):
        return FunctionPhase.Ready
    if ever_ready:
        return FunctionPhase.Degraded
    return FunctionPhase.Pending
