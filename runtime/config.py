"""What a function process is: immutable config, run identity, and how to start it."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from kruntimes.api.names import validate_env_name, validate_handler
from runtime import workspace
from runtime.errors import InvalidRequest, SourceInvalid
from runtime.limits import ProcessLimits
from runtime.sandbox.child import SandboxSpec
from runtime.spawner import SpawnSpec

BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True, slots=True)
class RunRef:
    run_uid: str
    attempt: int
    namespace: str = ""
    name: str = ""
    runtime: str = ""


@dataclass(frozen=True, slots=True)
class FunctionConfig:
    adapter: str
    handler: str
    env: tuple[tuple[str, str], ...] = ()
    source_path: str | None = None
    inline: tuple[tuple[str, bytes, bool], ...] | None = None

    def validate(self) -> None:
        try:
            validate_handler(self.adapter, self.handler)
            for name, _ in self.env:
                validate_env_name(name)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from exc
        if (self.source_path is None) == (self.inline is None):
            raise InvalidRequest("exactly one of source_path and inline is required")

    def digest(self) -> str:
        """Equal for equal configs; what 'same config' means for idempotent registration."""
        doc = {
            "adapter": self.adapter,
            "handler": self.handler,
            "env": sorted(self.env),
            "source_path": self.source_path,
            "inline": None
            if self.inline is None
            else sorted((n, hashlib.sha256(c).hexdigest(), x) for n, c, x in self.inline),
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def prepare_workdir(config: FunctionConfig, workdir: Path, policy: workspace.SourcePolicy) -> None:
    """Create `workdir` holding the function's source (the caller removes it with
    `workspace.remove`); a source that cannot be used is SourceInvalid."""
    try:
        workspace.prepare(
            workdir,
            source_path=config.source_path,
            inline=list(config.inline) if config.inline else None,
            policy=policy,
        )
    except workspace.SourceError as exc:
        raise SourceInvalid(str(exc)) from exc


def function_env(run: RunRef, config: FunctionConfig, workdir: Path) -> dict[str, str]:
    env = {"PATH": BASE_PATH, "HOME": str(workdir), "LANG": "C.UTF-8", "TMPDIR": str(workdir)}
    env.update(config.env)
    env.update(
        {
            "KRT_RUN_UID": run.run_uid,
            "KRT_ATTEMPT": str(run.attempt),
            "KRT_NAMESPACE": run.namespace,
            "KRT_RUN_NAME": run.name,
            "KRT_RUNTIME": run.runtime,
        }
    )
    return env


def spawn_spec(
    run: RunRef,
    config: FunctionConfig,
    workdir: Path,
    limits: ProcessLimits,
    *,
    once: bool,
    sandbox: SandboxSpec | None = None,
) -> SpawnSpec:
    env = function_env(run, config, workdir)
    if config.adapter == "bash":
        script = workdir / config.handler
        if not script.is_file():
            raise InvalidRequest(f"bash handler {config.handler!r} is not a file in the source")
        return SpawnSpec(
            kind="exec",
            cwd=str(workdir),
            env=env,
            limits=limits,
            argv=(_bash(), str(script)),
            sandbox=sandbox,
        )
    context = {
        "run_uid": run.run_uid,
        "namespace": run.namespace,
        "name": run.name,
        "attempt": str(run.attempt),
    }
    kind = "python-once" if once else "python"
    return SpawnSpec(
        kind=kind,
        cwd=str(workdir),
        env=env,
        limits=limits,
        handler=config.handler,
        context=context,
        sandbox=sandbox,
    )


def _bash() -> str:
    for candidate in ("/bin/bash", "/usr/bin/bash"):
        if os.access(candidate, os.X_OK):
            return candidate
    raise InvalidRequest("bash is not installed on this host")
