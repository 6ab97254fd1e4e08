"""The python adapter on the host: a warm process per registration, started from the zygote,
that imports the handler once and answers each call on its control socket (python_worker)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kruntimes.api.adapters import PYTHON
from kruntimes.runtime.adapters.host import HostAdapter
from kruntimes.runtime.limits import ProcessLimits
from kruntimes.runtime.sandbox.child import SandboxSpec
from kruntimes.runtime.spawner import SpawnSpec

if TYPE_CHECKING:
    from kruntimes.runtime.config import RunRef


class Python(HostAdapter):
    described = PYTHON

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
        context = {
            "run_uid": run.run_uid,
            "namespace": run.namespace,
            "name": run.name,
            "attempt": str(run.attempt),
        }
        return SpawnSpec(
            kind="python-once" if once else "python",
            cwd=str(workdir),
            env=env,
            limits=limits,
            handler=handler,
            context=context,
            sandbox=sandbox,
        )


ADAPTER = Python()
