"""The Function autoscaler's decisions (kruntimes.decisions.autoscale): stable and panic windows,
the scale-down delay and rate, scale to zero, bounds, and that memory stays bounded."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kruntimes.decisions import autoscale as a
from kruntimes.decisions.autoscale import Autoscaler, ScaleSettings


def scaler(**kwargs: float) -> Autoscaler:
    base: dict[str, float] = {"min": 1, "max": 16, "target": 1.0, "scale_down_delay_s": 30.0}
    base.update(kwargs)
    return Autoscaler(ScaleSettings(**base))  # type: ignore[arg-type]


def steady(s: Autoscaler, load: float, start: float, end: float, *, step: float = 1.0) -> None:
    t = start
    while t <= end:
        s.record(t, load)
        t += step


def test_no_report_yet_keeps_the_current_count() -> None:
    d = scaler().decide(0.0, current=3, ready=3)
    assert (d.wanted, d.reason, d.changed) == (3, a.NO_DATA, False)


def test_a_steady_load_wants_load_over_target_rounded_up() -> None:
    s = scaler(target=2.0)
    steady(s, 7.0, 0, 60)
    d = s.decide(60.0, current=4, ready=4)
    assert (d.wanted, d.reason) == (4, a.HOLD)
    steady(s, 9.0, 61, 180)
    d = s.decide(180.0, current=4, ready=4)
    assert (d.wanted, d.reason) == (5, a.SCALE_UP)
    assert "4 -> 5 replicas: stable load over target" in d.describe()


def test_a_load_step_panics_up_within_the_panic_window_and_never_down_while_panicking() -> None:
    s = scaler()
    steady(s, 1.0, 0, 60)
    assert s.decide(60.0, current=1, ready=1).wanted == 1
    steady(s, 16.0, 61, 67)  # the panic window's six seconds of the step: the stable mean is low
    d = s.decide(67.0, current=1, ready=1)
    assert d.panicking and d.reason == a.PANIC_UP and d.wanted == 16
    assert math.ceil(d.stable_load) < 16, "the stable window alone would not have scaled to 16"
    # the load falls back at once: no scale-down while the panic lasts
    steady(s, 1.0, 67, 100)
    d = s.decide(100.0, current=16, ready=16)
    assert d.panicking and (d.wanted, d.reason) == (16, a.PANIC_HOLD)


def test_the_panic_ends_a_stable_window_after_its_last_trigger_then_the_delay_applies() -> None:
    s = scaler(scale_down_delay_s=10.0)
    steady(s, 1.0, 0, 60)
    steady(s, 8.0, 61, 66)
    assert s.decide(66.0, current=1, ready=1).panicking
    steady(s, 1.0, 67, 130)
    d = s.decide(127.0, current=8, ready=8)
    assert not d.panicking
    # at most halving per decision
    assert d.wanted == 4 and d.reason == a.SCALE_DOWN


def test_scale_down_waits_out_the_delay_of_the_highest_wanted() -> None:
    s = scaler(scale_down_delay_s=30.0)
    steady(s, 4.0, 0, 60)
    assert s.decide(60.0, current=4, ready=4).wanted == 4
    # the stable mean is 2 from 121 s on; the decisions until 90 s still wanted 4 (a mean over 3)
    first_lower = first_two = None
    for t in range(61, 200):
        s.record(float(t), 2.0)
        d = s.decide(float(t), current=4, ready=4)
        if d.wanted < 4 and first_lower is None:
            first_lower = t
        if d.wanted == 2 and first_two is None:
            first_two = t
        assert d.reason in (a.HOLD, a.DELAYED, a.SCALE_DOWN)
    assert first_lower == 90 + 30 + 1, "not before the delay has passed over the last 4"
    assert first_two == 120 + 30 + 1, "and 2 once every decision of the delay wanted 2"


def test_scale_to_zero_only_after_a_whole_quiet_window_and_only_with_min_zero() -> None:
    s = scaler(min=0, scale_down_delay_s=0.0)
    steady(s, 0.0, 0, 30)
    assert s.decide(30.0, current=1, ready=1).wanted == 1, "half a window seen: keep one"
    steady(s, 0.0, 31, 61)
    d = s.decide(61.0, current=1, ready=1)
    assert (d.wanted, d.reason) == (0, a.TO_ZERO)
    kept = scaler(min=1, scale_down_delay_s=0.0)
    steady(kept, 0.0, 0, 61)
    assert kept.decide(61.0, current=1, ready=1).wanted == 1


def test_from_zero_any_load_wants_a_replica() -> None:
    s = scaler(min=0)
    s.record(0.0, 1.0)
    d = s.decide(0.0, current=0, ready=0)
    assert d.wanted >= 1 and d.changed


def test_bounds_hold_and_say_so() -> None:
    s = scaler(min=2, max=3)
    steady(s, 50.0, 0, 60)
    d = s.decide(60.0, current=2, ready=2)
    assert (d.wanted, d.reason) == (3, a.BOUND_MAX)
    low = scaler(min=2, max=3)
    assert (low.decide(0.0, current=0, ready=0).wanted, low.decide(0.0, current=0, ready=0).reason) == (
        2,
        a.BOUND_MIN,
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min": 3, "max": 2},
        {"min": 0, "max": 0},
        {"min": -1},
        {"target": 0.0},
        {"target": math.nan},
        {"scale_down_delay_s": -1.0},
        {"stable_window_s": 0.0},
        {"panic_fraction": 0.0},
        {"panic_threshold": 0.5},
        {"max_scale_down_rate": 0.5},
    ],
)
def test_settings_out_of_bounds_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        scaler(**kwargs)


@pytest.mark.parametrize("load", [-1.0, math.inf, math.nan])
def test_a_load_that_is_not_a_count_is_refused(load: float) -> None:
    with pytest.raises(ValueError):
        scaler().record(0.0, load)


def test_memory_stays_bounded_and_old_reports_are_ignored() -> None:
    s = scaler(stable_window_s=3600.0, scale_down_delay_s=3600.0)
    for i in range(a.MAX_SAMPLES + 500):
        s.record(i * 0.001, 1.0)
    assert len(s._samples) == a.MAX_SAMPLES
    s.record(0.0, 100.0)  # a report older than the newest: ignored
    assert s._samples[-1][1] == 1.0


@settings(max_examples=200, deadline=None)
@given(
    loads=st.lists(st.floats(min_value=0, max_value=500, allow_nan=False), min_size=1, max_size=200),
    lo=st.integers(min_value=0, max_value=5),
    span=st.integers(min_value=0, max_value=20),
    target=st.floats(min_value=0.5, max_value=50),
)
def test_every_decision_is_within_bounds_and_never_drops_below_half(
    loads: list[float], lo: int, span: int, target: float
) -> None:
    hi = max(1, lo + span)
    s = Autoscaler(ScaleSettings(min=lo, max=hi, target=target, scale_down_delay_s=5.0))
    current = lo
    for i, load in enumerate(loads):
        s.record(float(i), load)
        d = s.decide(float(i), current=current, ready=current)
        assert lo <= d.wanted <= hi
        assert d.reason in a.REASONS
        if d.wanted < current and current > 1:
            assert d.wanted >= min(math.ceil(current / 2), hi) or d.wanted == lo
        current = d.wanted


@settings(max_examples=100, deadline=None)
@given(
    loads=st.lists(st.sampled_from([0.0, 1.0, 3.0, 8.0, 20.0]), min_size=1, max_size=120),
    cut=st.integers(min_value=0, max_value=120),
    lo=st.integers(min_value=0, max_value=2),
)
def test_a_restored_snapshot_decides_as_the_autoscaler_it_was_taken_from(
    loads: list[float], cut: int, lo: int
) -> None:
    """An autoscaling activity that ends (or a retried one) hands its memory on: the next one,
    fed the same reports, takes the same decisions (a window of at most MAX_CARRIED_SAMPLES)."""
    make = ScaleSettings(min=lo, max=16, target=1.0, scale_down_delay_s=10.0, stable_window_s=20.0)
    original = Autoscaler(make)
    current = lo
    cut = min(cut, len(loads))
    for i, load in enumerate(loads[:cut]):
        original.record(float(i), load)
        current = original.decide(float(i), current=current, ready=current).wanted
    snapshot = original.snapshot()
    assert len(snapshot.samples) <= a.MAX_CARRIED_SAMPLES and len(snapshot.wanted) <= a.MAX_CARRIED_WANTED
    restored = Autoscaler.restore(make, snapshot)
    mirror = current
    for i, load in enumerate(loads[cut:], start=cut):
        original.record(float(i), load)
        restored.record(float(i), load)
        d = original.decide(float(i), current=current, ready=current)
        e = restored.decide(float(i), current=mirror, ready=mirror)
        assert (e.wanted, e.reason, e.panicking) == (d.wanted, d.reason, d.panicking)
        current, mirror = d.wanted, e.wanted


def test_a_snapshot_stays_bounded_over_a_long_delay_and_keeps_the_highest_wanted() -> None:
    s = scaler(stable_window_s=600.0, scale_down_delay_s=3600.0, max=100)
    for t in range(3600):
        s.record(float(t), float(t % 97))
        s.decide(float(t), current=50, ready=50)
    snapshot = s.snapshot()
    assert len(snapshot.samples) <= a.MAX_CARRIED_SAMPLES
    assert len(snapshot.wanted) <= a.MAX_CARRIED_WANTED
    held = max(w for _, w in s._wanted)
    assert max(w for _, w in snapshot.wanted) == held
    # the merged samples keep the mean over the whole window (each merge is of equal counts)
    restored = Autoscaler.restore(s.settings, snapshot)
    assert restored._mean(3599.0, 600.0) == pytest.approx(s._mean(3599.0, 600.0), rel=0.05)


def test_a_malformed_snapshot_is_dropped_not_trusted() -> None:
    bad = a.Snapshot(
        samples=((math.nan, 1.0), (1.0, -5.0), (2.0, 1.0)), wanted=((math.inf, 3),), panic_until=math.nan
    )
    s = Autoscaler.restore(scaler().settings, bad)
    assert list(s._samples) == [(2.0, 1.0)] and not s._wanted and s._panic_until is None


def test_scale_to_zero_when_the_samples_do_not_fall_on_the_window_edge() -> None:
    """Samples a second apart at any offset: once a whole quiet window is watched, zero."""
    s = scaler(min=0, stable_window_s=6.0, scale_down_delay_s=2.0)
    decisions = []
    for i in range(12):
        t = 100.37 + i
        s.record(t, 0.0)
        decisions.append(s.decide(t, current=1, ready=1))
    assert decisions[4].wanted == 1, "less than a window watched"
    assert any(d.reason == a.TO_ZERO for d in decisions[6:8])
