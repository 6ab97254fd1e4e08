"""A language adapter as the Runtime Server runs it: how its process starts, how many calls a
registration takes at once, and how its answer is read. Each adapter is one subclass, in its own
module, registered under its description's name (`kruntimes.api.adapters`) in
`kruntimes.runtime.adapters.registered`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from kruntimes.api.adapters import Adapter
from kruntimes.api.limits import MAX_OUTPUTS_TOTAL_BYTES
from kruntimes.runtime.limits import ProcessLimits
from kruntimes.runtime.outcome import Outcome, Status
from kruntimes.runtime.results import check_outputs
from kruntimes.runtime.sandbox.child import SandboxSpec
from kruntimes.runtime.spawner import SpawnSpec

if TYPE_CHECKING:  # kruntimes.runtime.config looks adapters up by name: it imports this package
    from kruntimes.runtime.config import RunRef


class RunOnce(Protocol):
    """How a process is started for one call and waited for (`kruntimes.runtime.lanes.Lanes.run`, or
    `kruntimes.runtime.once.run_once` with its spawner and spec)."""

    def __call__(
        self,
        data: bytes,
        timeout_s: float,
        *,
        stdout_limit: int,
        on_start: Callable[[int], None] | None = None,
    ) -> Outcome: ...


class HostAdapter(ABC):
    described: ClassVar[Adapter]
    # A registration takes up to the host's krm_concurrency calls at once, each a process of its
    # own; otherwise one call at a time.
    concurrent: ClassVar[bool] = False
    # A per-call registration is called as soon as it is registered: its first lane starts then.
    prestart: ClassVar[bool] = False
    # An answer past the stdout bound is refused whole: its lane stops the function there.
    stop_past_limit: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return self.described.name

    @property
    def warm(self) -> bool:
        """A registration keeps one process answering its calls; otherwise `call` runs each."""
        return self.described.warm

    @abstractmethod
    def spawn_spec(
        self,
        run: RunRef,
        handler: str,
        workdir: Path,
        *,
        once: bool,
        env: dict[str, str],
        limits: ProcessLimits,
        sandbox: SandboxSpec | None,
    ) -> SpawnSpec:
        """The function's process: the warm one (`once` False) or the one of a single call."""

    def read_outputs(self, outcome: Outcome) -> None:
        """A Succeeded process's answer (a warm exchange, a task) made its outputs, or refused."""
        check_outputs(outcome)

    def call(
        self,
        run: RunOnce,
        payload: bytes,
        timeout_s: float,
        *,
        on_start: Callable[[int], None] | None = None,
    ) -> Outcome:
        """One call of a per-call registration: its process started with the payload, its answer read."""
        outcome = run(payload, timeout_s, stdout_limit=MAX_OUTPUTS_TOTAL_BYTES, on_start=on_start)
        if outcome.status is Status.SUCCEEDED:
            self.read_outputs(outcome)
        return outcome
