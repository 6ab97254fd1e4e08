"""Task-mode executions: run once, idempotent per (run uid, attempt), results kept for a while."""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from kruntimes.api.limits import MAX_OUTPUTS_TOTAL_BYTES
from kruntimes.runtime import workspace
from kruntimes.runtime.adapters.registered import host_adapter
from kruntimes.runtime.config import HandlerConfig, RunRef
from kruntimes.runtime.errors import HostUnavailable, RegistrationConflict
from kruntimes.runtime.launch import Launcher
from kruntimes.runtime.once import run_once
from kruntimes.runtime.outcome import Outcome, Status, set_error
from kruntimes.runtime.sandbox.identity import NoFreeUid
from kruntimes.runtime.spawner import SpawnError

RETAIN_RESULTS = 1000  # finished executions remembered for callers that retry
RETAIN_SECONDS = 3600.0


@dataclass(eq=False)
class Execution:
    digest: str
    done: threading.Event = field(default_factory=threading.Event)
    outcome: Outcome | None = None
    pid: int | None = None
    cancelled: bool = False
    finished_at: float = 0.0


class Tasks:
    def __init__(self, *, launcher: Launcher) -> None:
        self.launcher = launcher
        self.spawner = launcher.spawner
        self._lock = threading.Lock()
        self._runs: OrderedDict[tuple[str, int], Execution] = OrderedDict()

    def execute(self, run: RunRef, config: HandlerConfig, data: bytes, timeout_s: float) -> Outcome:
        """Run the task, or wait for the same (run uid, attempt) already running, or return its result."""
        config.validate()
        digest = config.digest()
        key = (run.run_uid, run.attempt)
        with self._lock:
            self._evict()
            execution = self._runs.get(key)
            owner = execution is None
            if execution is None:
                execution = self._runs[key] = Execution(digest)
        if execution.digest != digest:
            raise RegistrationConflict(
                f"task {run.run_uid} attempt {run.attempt} was started with another config"
            )
        if not owner:
            execution.done.wait()
            assert execution.outcome is not None
            return execution.outcome
        try:
            execution.outcome = self._run(run, config, data, timeout_s, execution)
        except BaseException:
            with self._lock:
                self._runs.pop(key, None)  # nothing ran to completion: a retry may start afresh
            execution.done.set()
            raise
        execution.finished_at = time.monotonic()
        execution.done.set()
        return execution.outcome

    def _run(
        self, run: RunRef, config: HandlerConfig, data: bytes, timeout_s: float, execution: Execution
    ) -> Outcome:
        workdir = self.launcher.workspace(f"task-{run.run_uid}.{run.attempt}", config)
        lease = None
        try:
            lease = self.launcher.identity("task-" + secrets.token_hex(12), workdir)
            env = self.launcher.env(run, config)
            spec = self.launcher.spec(run, config, workdir, lease=lease, env=env, once=True)

            def started(pid: int) -> None:
                execution.pid = pid
                if execution.cancelled:
                    self.spawner.kill(pid)
                self.launcher.replenish()

            outcome = run_once(
                self.spawner, spec, data, timeout_s, stdout_limit=MAX_OUTPUTS_TOTAL_BYTES, on_start=started
            )
        except (SpawnError, NoFreeUid) as exc:
            raise HostUnavailable(str(exc)) from exc
        finally:
            try:
                if lease is not None:
                    self.launcher.release(lease)
            finally:
                workspace.remove(workdir)
        if execution.cancelled:
            set_error(outcome, Status.CANCELLED, "Cancelled", "cancelled")
        elif outcome.status is Status.SUCCEEDED:
            host_adapter(config.adapter).read_outputs(outcome)
        return outcome

    def cancel(self, run_uid: str, attempt: int) -> bool:
        with self._lock:
            execution = self._runs.get((run_uid, attempt))
        if execution is None:
            return False
        if not execution.done.is_set():
            execution.cancelled = True
            if execution.pid is not None:
                self.spawner.kill(execution.pid)
        return True

    def running(self) -> int:
        with self._lock:
            return sum(1 for e in self._runs.values() if not e.done.is_set())

    def _evict(self) -> None:
        now = time.monotonic()
        for key, execution in list(self._runs.items()):
            finished = execution.done.is_set()
            if finished and (
                len(self._runs) > RETAIN_RESULTS or now - execution.finished_at > RETAIN_SECONDS
            ):
                del self._runs[key]

    def close(self) -> None:
        with self._lock:
            running = [(k, e) for k, e in self._runs.items() if not e.done.is_set()]
        for (uid, attempt), _ in running:
            self.cancel(uid, attempt)
