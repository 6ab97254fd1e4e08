"""The bash adapter on the host: each call runs the handler's script with the payload on stdin;
its stdout is its outputs (`kruntimes.runtime.results.parse_script_outputs`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from kruntimes.api.adapters import BASH
from kruntimes.runtime.adapters.host import HostAdapter
from kruntimes.runtime.errors import InvalidRequest
from kruntimes.runtime.limits import ProcessLimits
from kruntimes.runtime.outcome import Outcome
from kruntimes.runtime.results import parse_script_outputs
from kruntimes.runtime.sandbox.child import SandboxSpec
from kruntimes.runtime.spawner import SpawnSpec

if TYPE_CHECKING:
    from kruntimes.runtime.config import RunRef


class Bash(HostAdapter):
    described = BASH

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
        script = workdir / handler
        if not script.is_file():
            raise InvalidRequest(f"bash handler {handler!r} is not a file in the source")
        argv = (_bash(), str(script))
        return SpawnSpec(kind="exec", cwd=str(workdir), env=env, limits=limits, argv=argv, sandbox=sandbox)

    def read_outputs(self, outcome: Outcome) -> None:
        parse_script_outputs(outcome)


def _bash() -> str:
    for candidate in ("/bin/bash", "/usr/bin/bash"):
        if os.access(candidate, os.X_OK):
            return candidate
    raise InvalidRequest("bash is not installed on this host")


ADAPTER = Bash()
