"""A circuit breaker per (provider, runtime) for host creates, in the worker's memory.

Closed: creates go to the provider, and `failures` failed in a row open the circuit. Open: a
create fails at once with CircuitOpen (the provider is not called) until `openSeconds` have
passed. Half-open: one create goes through as a trial while the others still fail at once; its
success closes the circuit, its failure opens it again for `openSeconds`.

The state is per worker process and starts closed at every start: each worker protects the
provider from its own calls (docs/operations.md, "The provider circuit breaker").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

from kruntimes.config.runtimes import ProviderCircuitConfig


class CircuitState(IntEnum):
    """Its value is the `kruntimes_provider_circuit_state` gauge's."""

    Closed = 0
    HalfOpen = 1
    Open = 2


@dataclass
class _Circuit:
    failures: int = 0  # consecutive failed creates
    opened_at: float | None = None  # when it last opened; None: closed
    trial: bool = False  # a half-open trial create is running
    last: str = ""  # the last failure's reason and message, said while it is open


@dataclass(frozen=True)
class Admission:
    """What `admit` decided: `open_for` is None when the create may go ahead (`trial` when it is
    the half-open trial), else how many seconds the circuit stays open."""

    open_for: float | None
    trial: bool = False
    failures: int = 0
    last: str = ""  # why the last create failed: a Run refused by an open circuit is told the cause


class CircuitBreakers:
    """The breakers of one worker, keyed by (provider, runtime); `clock` is monotonic seconds."""

    def __init__(
        self, config: ProviderCircuitConfig | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config or ProviderCircuitConfig()
        self.clock = clock
        # Keys are the runtimes of the config a worker serves (validated labels): bounded.
        self._circuits: dict[tuple[str, str], _Circuit] = {}

    def state(self, provider: str, runtime: str) -> CircuitState:
        circuit = self._circuits.get((provider, runtime))
        if circuit is None or circuit.opened_at is None:
            return CircuitState.Closed
        if circuit.trial or self.clock() - circuit.opened_at >= self.config.openSeconds:
            return CircuitState.HalfOpen
        return CircuitState.Open

    def admit(self, provider: str, runtime: str) -> Admission:
        """Whether a create may call the provider now; a half-open circuit lets one through."""
        circuit = self._circuits.setdefault((provider, runtime), _Circuit())
        if circuit.opened_at is None:
            return Admission(None)
        left = circuit.opened_at + self.config.openSeconds - self.clock()
        if left > 0 or circuit.trial:
            return Admission(max(left, 0.0), failures=circuit.failures, last=circuit.last)
        circuit.trial = True
        return Admission(None, trial=True, failures=circuit.failures)

    def succeeded(self, provider: str, runtime: str) -> None:
        """A create succeeded: the provider works, the circuit closes."""
        self._circuits[(provider, runtime)] = _Circuit()

    def failed(self, provider: str, runtime: str, *, trial: bool, last: str = "") -> None:
        """A create failed (`last`: its reason and message): one more in a row; the circuit opens at
        the limit, or again after a failed trial (a failure of a create admitted before it opened
        does not extend it)."""
        circuit = self._circuits.setdefault((provider, runtime), _Circuit())
        circuit.failures += 1
        circuit.last = last[:300]
        if trial:
            circuit.trial = False
            circuit.opened_at = self.clock()
        elif circuit.opened_at is None and circuit.failures >= self.config.failures:
            circuit.opened_at = self.clock()

    def abandoned(self, provider: str, runtime: str, *, trial: bool) -> None:
        """A create ended without a verdict on the provider (cancelled): a trial's turn is free."""
        if trial:
            circuit = self._circuits.get((provider, runtime))
            if circuit is not None:
                circuit.trial = False
