"""What a function process is: immutable config, run identity, and how to start it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from kruntimes.api.adapters import validate_handler
from kruntimes.api.names import validate_env_name
from kruntimes.runtime import workspace
from kruntimes.runtime.adapters.registered import host_adapter
from kruntimes.runtime.errors import InvalidRequest, SecretNotFound, SourceInvalid
from kruntimes.runtime.limits import ProcessLimits
from kruntimes.runtime.sandbox.child import SandboxSpec
from kruntimes.runtime.secret_access import RunCreator, SecretAccess, SecretUse
from kruntimes.runtime.spawner import SpawnSpec

BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True, slots=True)
class RunRef:
    run_uid: str
    attempt: int
    namespace: str = ""
    name: str = ""
    runtime: str = ""


@dataclass(frozen=True, slots=True)
class HandlerConfig:
    adapter: str
    handler: str
    env: tuple[tuple[str, str], ...] = ()
    source_path: str | None = None
    inline: tuple[tuple[str, bytes, bool], ...] | None = None
    env_from: tuple[tuple[str, str], ...] = ()  # (secret, prefix): resolved at registration
    creator: RunCreator | None = None  # who started the Run: whether env_from may be resolved

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
            "env_from": list(self.env_from),
        }
        if self.creator is not None:
            doc["creator"] = str(self.creator)
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def prepare_workdir(config: HandlerConfig, workdir: Path, policy: workspace.SourcePolicy) -> None:
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


def resolve_env(run: RunRef, config: HandlerConfig, secrets: SecretAccess | None) -> dict[str, str]:
    """The function's own environment: its secrets' keys (envFrom, for a creator bound to use
    them), then its `env` over them."""
    env: dict[str, str] = {}
    if config.env_from:
        if secrets is None:
            raise SecretNotFound("this host has no secret store; envFrom cannot be resolved")
        use = SecretUse(run.run_uid, run.attempt, run.namespace or "default", run.name, config.creator)
        env.update(secrets.resolve(use, config.env_from))
    env.update(config.env)
    return env


def function_env(run: RunRef, env_of_run: dict[str, str], workdir: Path) -> dict[str, str]:
    env = {"PATH": BASE_PATH, "HOME": str(workdir), "LANG": "C.UTF-8", "TMPDIR": str(workdir)}
    env.update(env_of_run)
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
    config: HandlerConfig,
    workdir: Path,
    limits: ProcessLimits,
    *,
    once: bool,
    sandbox: SandboxSpec | None = None,
    env: dict[str, str] | None = None,
) -> SpawnSpec:
    """`env`: the Run's own environment as `resolve_env` made it (None: just `config.env`)."""
    env = function_env(run, dict(config.env) if env is None else env, workdir)
    return host_adapter(config.adapter).spawn_spec(
        run, config.handler, workdir, once=once, env=env, limits=limits, sandbox=sandbox
    )
