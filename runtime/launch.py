"""What registrations (runtime/registry.py) and task executions (runtime/tasks.py) share to start
a function: its workspace, its environment, its identity on the host and its process spec."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kruntimes.runtime import workspace
from kruntimes.runtime.config import HandlerConfig, RunRef, prepare_workdir, resolve_env, spawn_spec
from kruntimes.runtime.isolation import FunctionIsolation, Lease
from kruntimes.runtime.limits import ProcessLimits
from kruntimes.runtime.secret_access import SecretAccess
from kruntimes.runtime.spawner import Spawner, SpawnSpec
from kruntimes.runtime.workspace import SourcePolicy


@dataclass(frozen=True)
class Launcher:
    spawner: Spawner
    work_root: Path
    limits: ProcessLimits
    isolation: FunctionIsolation | None = None
    sources: SourcePolicy = field(default_factory=SourcePolicy)
    secrets: SecretAccess | None = None

    def workspace(self, name: str, config: HandlerConfig) -> Path:
        """The function's workspace `name` under the work root, holding its source (removed
        with `workspace.remove`)."""
        workdir = workspace.workdir(self.work_root, name)
        prepare_workdir(config, workdir, self.sources)
        return workdir

    def env(self, run: RunRef, config: HandlerConfig) -> dict[str, str]:
        return resolve_env(run, config, self.secrets)

    def identity(self, slot: str, workdir: Path) -> Lease | None:
        """The function's own identity owning `workdir` (None without isolation); given back
        with `release`."""
        if self.isolation is None:
            return None
        lease = self.isolation.lease(slot)
        try:
            lease.own(workdir)
        except BaseException:
            self.isolation.release(lease)
            raise
        return lease

    def release(self, lease: Lease) -> None:
        """After the function's processes were killed: free its identity."""
        if self.isolation is not None:
            self.isolation.release(lease)

    def replenish(self) -> None:
        """The function's process started: the next identity is made off its path."""
        if self.isolation is not None:
            self.isolation.replenish()

    def spec(
        self,
        run: RunRef,
        config: HandlerConfig,
        workdir: Path,
        *,
        lease: Lease | None,
        env: dict[str, str],
        once: bool,
    ) -> SpawnSpec:
        sandbox = lease.sandbox(workdir) if lease is not None else None
        return spawn_spec(run, config, workdir, self.limits, once=once, sandbox=sandbox, env=env)
