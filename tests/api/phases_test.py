from __future__ import annotations

import itertools

import pytest

from kruntimes.api import TERMINAL_PHASES, RunPhase, can_transition, is_active, is_terminal

P = RunPhase
NON_TERMINAL = [P.Pending, P.Scheduled, P.Running, P.Ready]

# Written out independently of the implementation's table.
ALLOWED = {
    (P.Pending, P.Scheduled),
    (P.Scheduled, P.Running),
    (P.Running, P.Ready),
    (P.Running, P.Succeeded),
    (P.Running, P.Failed),
    (P.Running, P.Timeout),
    (P.Ready, P.Running),
    (P.Scheduled, P.Pending),
    (P.Running, P.Pending),
    *((src, dst) for src in NON_TERMINAL for dst in (P.Cancelled, P.Failed, P.Timeout)),
}


def test_phase_values_equal_their_names():
    assert [p.value for p in RunPhase] == [p.name for p in RunPhase]
    assert len(RunPhase) == 8


def test_terminal_phases_are_exactly_the_four_endings():
    assert {P.Succeeded, P.Failed, P.Timeout, P.Cancelled} == TERMINAL_PHASES


def test_ready_is_active_and_never_terminal():
    assert is_active(P.Ready)
    assert not is_terminal(P.Ready)


@pytest.mark.parametrize("phase", list(RunPhase), ids=str)
def test_every_phase_is_either_active_or_terminal(phase):
    assert is_active(phase) != is_terminal(phase)
    assert is_active(phase) == (phase in NON_TERMINAL)


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(RunPhase, RunPhase)), ids=lambda p: str(p))
def test_transition_table_matches_the_lifecycle(src, dst):
    assert can_transition(src, dst) == ((src, dst) in ALLOWED)


@pytest.mark.parametrize("src", sorted(TERMINAL_PHASES), ids=str)
def test_terminal_phases_never_leave(src):
    assert not any(can_transition(src, dst) for dst in RunPhase)


def test_function_mode_path_reaches_ready():
    path = [P.Pending, P.Scheduled, P.Running, P.Ready]
    assert all(can_transition(a, b) for a, b in itertools.pairwise(path))


def test_recovery_reregisters_a_ready_run_and_requeues_an_assigned_one():
    assert can_transition(P.Ready, P.Running)
    assert can_transition(P.Running, P.Pending)
    assert can_transition(P.Scheduled, P.Pending)
    assert not can_transition(P.Ready, P.Pending)


def test_a_phase_to_itself_is_not_a_transition():
    assert not any(can_transition(p, p) for p in RunPhase)
