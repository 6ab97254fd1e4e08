"""Run phases and the lifecycle state machine.

    Pending ─▶ Scheduled ─▶ Running ─▶ Ready                 (function mode)
                            Running ─▶ Succeeded | Failed | Timeout  (task mode)
    any non-terminal ─▶ Cancelled | Failed | Timeout
    Ready ─▶ Running               (re-registration during recovery)
    Scheduled | Running ─▶ Pending (re-queued during recovery)

Ready is active and never terminal. A phase to itself is not a transition.
"""

from __future__ import annotations

from enum import StrEnum


class RunPhase(StrEnum):
    Pending = "Pending"
    Scheduled = "Scheduled"
    Running = "Running"
    Ready = "Ready"
    Succeeded = "Succeeded"
    Failed = "Failed"
    Timeout = "Timeout"
    Cancelled = "Cancelled"


TERMINAL_PHASES: frozenset[RunPhase] = frozenset(
    {RunPhase.Succeeded, RunPhase.Failed, RunPhase.Timeout, RunPhase.Cancelled}
)
ACTIVE_PHASES: frozenset[RunPhase] = frozenset(RunPhase) - TERMINAL_PHASES

_ALWAYS_REACHABLE = frozenset({RunPhase.Cancelled, RunPhase.Failed, RunPhase.Timeout})

_TRANSITIONS: dict[RunPhase, frozenset[RunPhase]] = {
    RunPhase.Pending: _ALWAYS_REACHABLE | {RunPhase.Scheduled},
    RunPhase.Scheduled: _ALWAYS_REACHABLE | {RunPhase.Running, RunPhase.Pending},
    RunPhase.Running: _ALWAYS_REACHABLE | {RunPhase.Ready, RunPhase.Succeeded, RunPhase.Pending},
    RunPhase.Ready: _ALWAYS_REACHABLE | {RunPhase.Running},
    **{phase: frozenset() for phase in TERMINAL_PHASES},
}


def is_terminal(phase: RunPhase) -> bool:
    return phase in TERMINAL_PHASES


def is_active(phase: RunPhase) -> bool:
    return phase in ACTIVE_PHASES


def can_transition(src: RunPhase, dst: RunPhase) -> bool:
    return dst in _TRANSITIONS[src]
