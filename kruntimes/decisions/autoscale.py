"""How many replicas a Function wants, from the load its replicas report, as a pure decision.

The anchor is Knative's pod autoscaler: the load is the invocations in flight plus those waiting,
summed over the Function's replicas; the replicas wanted are that load over the target
concurrency of one replica, rounded up, bounded by the Function's `min` and `max`.

- **Stable window.** The load used is its mean over the last `stable_window_s` (60 s), so a
  short burst or lull does not move the replica count.
- **Panic window.** Its mean over the last tenth of that window is watched too; when that alone
  would want at least `panic_threshold` (2×) the replicas Ready, the autoscaler panics: it scales
  up to what the panic window wants and never down, until the load has stayed below the threshold
  for a whole stable window. A load step is answered in seconds, not in a minute.
- **Scale-down delay.** A lower count is taken only once every decision over the last
  `scale_down_delay_s` wanted no more than it (the highest wanted over that span is kept), so
  the replicas of a load that comes and goes are kept warm; and at most halving per decision
  (`max_scale_down_rate`), so a dip in the reports never drops most replicas at once.
- **Scale to zero.** With `min` 0, the Function goes to zero only after the stable window and the
  delay have seen no load at all.

Nothing here reads a clock or does I/O: the caller passes the time of each sample and decision
in, so the same inputs give the same decisions (the Function's workflow records each one with its
reason). Memory is bounded: samples older than the longest window are dropped, and at most
MAX_SAMPLES are kept (the oldest go first).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

MAX_SAMPLES = 10_000
# What a snapshot keeps at most (it crosses a workflow's history: an activity's result and the
# next one's input): samples merged into this many, and the scale-down delay's wanted counts.
MAX_CARRIED_SAMPLES = 128
MAX_CARRIED_WANTED = 128
DEFAULT_STABLE_WINDOW_S = 60.0
DEFAULT_PANIC_FRACTION = 0.1
DEFAULT_PANIC_THRESHOLD = 2.0
DEFAULT_MAX_SCALE_DOWN_RATE = 2.0


@dataclass(frozen=True, slots=True)
class ScaleSettings:
    """A Function's scale bounds and target, and the windows the decisions average over."""

    min: int
    max: int
    target: float  # invocations one replica should carry (in flight plus waiting)
    scale_down_delay_s: float = 30.0
    stable_window_s: float = DEFAULT_STABLE_WINDOW_S
    panic_fraction: float = DEFAULT_PANIC_FRACTION
    panic_threshold: float = DEFAULT_PANIC_THRESHOLD
    max_scale_down_rate: float = DEFAULT_MAX_SCALE_DOWN_RATE

    def __post_init__(self) -> None:
        if not 0 <= self.min <= self.max or self.max < 1:
            raise ValueError(f"scale bounds min {self.min}, max {self.max}: need 0 <= min <= max, max >= 1")
        if not (math.isfinite(self.target) and self.target > 0):
            raise ValueError(f"target concurrency {self.target}: must be a positive number")
        if not 0 <= self.scale_down_delay_s <= 24 * 3600:
            raise ValueError(f"scale-down delay {self.scale_down_delay_s}: 0..86400 seconds")
        if not 1 <= self.stable_window_s <= 3600:
            raise ValueError(f"stable window {self.stable_window_s}: 1..3600 seconds")
        if not 0 < self.panic_fraction <= 1:
            raise ValueError(f"panic window fraction {self.panic_fraction}: in (0, 1]")
        if not self.panic_threshold >= 1:
            raise ValueError(f"panic threshold {self.panic_threshold}: at least 1")
        if not self.max_scale_down_rate >= 1:
            raise ValueError(f"max scale-down rate {self.max_scale_down_rate}: at least 1")

    @property
    def panic_window_s(self) -> float:
        return self.stable_window_s * self.panic_fraction


@dataclass(frozen=True, slots=True)
class Decision:
    """What the autoscaler concluded at one moment, and why (the workflow records both)."""

    wanted: int
    current: int
    reason: str  # one of the REASONS
    stable_load: float
    panic_load: float
    panicking: bool

    @property
    def changed(self) -> bool:
        return self.wanted != self.current

    def describe(self) -> str:
        """One line for a workflow's history and a log: from, to, why, and the loads."""
        return (
            f"{self.current} -> {self.wanted} replicas: {self.reason} (load {self.stable_load:.2f} "
            f"over the stable window, {self.panic_load:.2f} over the panic window"
            f"{', panicking' if self.panicking else ''})"
        )


# why a decision wants what it wants
HOLD = "load matches the replicas"
SCALE_UP = "stable load over target"
PANIC_UP = "load jumped: panic window"
PANIC_HOLD = "panicking: no scale-down"
DELAYED = "lower load, waiting out the scale-down delay"
SCALE_DOWN = "stable load under target"
TO_ZERO = "no load: scale to zero"
BOUND_MIN = "held at min"
BOUND_MAX = "held at max"
NO_DATA = "no load report yet"
REASONS = (HOLD, SCALE_UP, PANIC_UP, PANIC_HOLD, DELAYED, SCALE_DOWN, TO_ZERO, BOUND_MIN, BOUND_MAX, NO_DATA)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An Autoscaler's memory, bounded, so a new one (another activity, another worker) goes on
    from where it stopped: samples as (at, load), the delay's wanted counts as (at, wanted)."""

    samples: tuple[tuple[float, float], ...] = ()
    wanted: tuple[tuple[float, int], ...] = ()
    panic_until: float | None = None
    last_at: float | None = None


@dataclass(slots=True)
class Autoscaler:
    """A Function's load samples and past decisions; `decide` is called at each evaluation."""

    settings: ScaleSettings
    _samples: deque[tuple[float, float]] = field(default_factory=deque)  # (at, load)
    _wanted: deque[tuple[float, int]] = field(default_factory=deque)  # (at, wanted before delay)
    _panic_until: float | None = None  # the panic ends at this time unless triggered again
    _last_at: float = -math.inf

    @classmethod
    def restore(cls, settings: ScaleSettings, snapshot: Snapshot | None) -> Autoscaler:
        """An Autoscaler with `snapshot`'s memory (None: none); what is malformed is dropped."""
        scaler = cls(settings)
        if snapshot is None:
            return scaler
        samples = [(at, load) for at, load in snapshot.samples if math.isfinite(at) and math.isfinite(load)]
        scaler._samples.extend(sorted((at, load) for at, load in samples if load >= 0)[-MAX_SAMPLES:])
        scaler._wanted.extend(sorted((at, w) for at, w in snapshot.wanted if math.isfinite(at) and w >= 0))
        if snapshot.panic_until is not None and math.isfinite(snapshot.panic_until):
            scaler._panic_until = snapshot.panic_until
        newest = max((at for at, _ in scaler._samples), default=-math.inf)
        last = (
            snapshot.last_at if snapshot.last_at is not None and math.isfinite(snapshot.last_at) else newest
        )
        scaler._last_at = max(last, newest)
        return scaler

    def snapshot(self) -> Snapshot:
        """This memory, bounded: consecutive samples merged (their mean, at the newest's time) into
        at most MAX_CARRIED_SAMPLES, and of the delay's wanted counts only those a later one does
        not exceed (what the highest over the delay needs), at most MAX_CARRIED_WANTED."""
        samples = list(self._samples)
        per = math.ceil(len(samples) / MAX_CARRIED_SAMPLES) if samples else 1
        merged = []
        for i in range(0, len(samples), per):
            group = samples[i : i + per]
            merged.append((group[-1][0], sum(load for _, load in group) / len(group)))
        kept: list[tuple[float, int]] = []
        for at, w in reversed(self._wanted):
            if not kept or w > kept[-1][1]:
                kept.append((at, w))
        return Snapshot(
            samples=tuple(merged),
            wanted=tuple(reversed(kept[:MAX_CARRIED_WANTED])),
            panic_until=self._panic_until,
            last_at=self._last_at if math.isfinite(self._last_at) else None,
        )

    def record(self, at: float, load: float) -> None:
        """One report of the load (in flight plus waiting, over every replica) at `at` seconds.
        A sample older than the newest one is ignored (reports are not reordered)."""
        if not math.isfinite(load) or load < 0:
            raise ValueError(f"load {load}: must be a finite number >= 0")
        if at < self._last_at:
            return
        self._last_at = at
        self._samples.append((at, load))
        if len(self._samples) > MAX_SAMPLES:
            self._samples.popleft()
        self._forget(at)

    def _forget(self, now: float) -> None:
        keep = max(self.settings.stable_window_s, self.settings.scale_down_delay_s)
        # one sample at or before the span is kept: it shows the span was watched (scale to zero)
        while len(self._samples) > 1 and self._samples[1][0] <= now - keep:
            self._samples.popleft()
        while self._wanted and self._wanted[0][0] < now - self.settings.scale_down_delay_s:
            self._wanted.popleft()

    def _mean(self, now: float, window: float) -> float | None:
        inside = [load for at, load in self._samples if at >= now - window]
        return sum(inside) / len(inside) if inside else None

    def decide(self, now: float, *, current: int, ready: int) -> Decision:
        """The replicas wanted at `now`, given `current` wanted so far and `ready` of them Ready."""
        s = self.settings
        self._forget(now)
        stable = self._mean(now, s.stable_window_s)
        panic = self._mean(now, s.panic_window_s)
        if stable is None or panic is None:
            return self._bounded(current, current, NO_DATA, 0.0, 0.0, self._panic_until is not None)
        want_stable = math.ceil(stable / s.target - 1e-9)
        want_panic = math.ceil(panic / s.target - 1e-9)
        # the panic threshold compares with what serves now; with none Ready, any load panics
        base = max(ready, 1)
        if want_panic / base >= s.panic_threshold:
            self._panic_until = now + s.stable_window_s
        elif self._panic_until is not None and now >= self._panic_until:
            self._panic_until = None
        panicking = self._panic_until is not None
        if panicking:
            wanted = max(current, want_panic, want_stable)
            reason = PANIC_UP if wanted > current else PANIC_HOLD
            return self._bounded(wanted, current, reason, stable, panic, True)
        self._wanted.append((now, want_stable))
        if want_stable > current:
            return self._bounded(want_stable, current, SCALE_UP, stable, panic, False)
        if want_stable == current:
            return self._bounded(current, current, HOLD, stable, panic, False)
        # lower: the highest wanted over the delay, then at most a halving per decision
        held = max(w for _, w in self._wanted)
        floor = math.ceil(current / s.max_scale_down_rate) if current > 1 else 0
        wanted = max(held, want_stable, floor)
        if wanted >= current:
            return self._bounded(current, current, DELAYED, stable, panic, False)
        if wanted == 0:
            quiet = all(load == 0 for _, load in self._samples)
            covered = bool(self._samples) and self._samples[0][0] <= now - s.stable_window_s
            if not (quiet and covered):
                return self._bounded(max(1, wanted), current, SCALE_DOWN, stable, panic, False)
            return self._bounded(0, current, TO_ZERO, stable, panic, False)
        return self._bounded(wanted, current, SCALE_DOWN, stable, panic, False)

    def _bounded(
        self, wanted: int, current: int, reason: str, stable: float, panic: float, panicking: bool
    ) -> Decision:
        s = self.settings
        if wanted < s.min:
            wanted, reason = s.min, BOUND_MIN
        elif wanted > s.max:
            wanted, reason = s.max, BOUND_MAX
        return Decision(wanted, current, reason, stable, panic, panicking)
