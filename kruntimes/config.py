"""Platform configuration: runtimes, tenants and pool limits, read once from YAML at an entry point.

    runtimes:
      - name: python
        adapter: python
        runs: 10          # run slots per host
        minHosts: 0       # warm hosts kept
        maxHosts: 4
        provider: process
        scaleInDelaySeconds: 300      # a host beyond minHosts idle this long is drained and deleted
        assignmentTimeoutSeconds: 60  # a host not Ready after twice this is deleted and replaced
        oneshot: false                # true: every Run gets a fresh host, deleted when it ends
    tenants:
      - name: tenant-a
        mode: Dedicated
    queueLimit: 1000
    heartbeatIntervalSeconds: 5
    reconcileIntervalSeconds: 60  # the orphan collection of every runtime

Anything left out takes its default; no file at all gives the ``python`` and ``bash`` runtimes.

Errors::

    ValueError
     └── ConfigError   the file could not be read or validated; .problems by field path
"""

from __future__ import annotations

import os
from typing import Annotated, Literal, Self

import yaml
from pydantic import AfterValidator, Field, ValidationError, field_validator, model_validator

from kruntimes.api._base import ApiModel, StrictBool, StrictFloat, StrictInt
from kruntimes.api.limits import (
    DAY_SECONDS,
    DEFAULT_INVOKE_TIMEOUT_SECONDS,
    MAX_INVOKE_TIMEOUT_SECONDS,
)
from kruntimes.api.names import validate_dns1123_label
from kruntimes.scheduling.failures import ProviderName
from kruntimes.scheduling.model import SHARED_POLICY, TenancyMode, TenantPolicy

DEFAULT_RUNS = 10
DEFAULT_MAX_HOSTS = 4
DEFAULT_QUEUE_LIMIT = 1000
# Bounds that keep durable timers and queue state sane.
MAX_QUEUE_LIMIT = 100_000
MAX_HOSTS_LIMIT = 10_000
MAX_RUNS_PER_HOST = 10_000


def _label(field: str) -> AfterValidator:
    return AfterValidator(lambda value: validate_dns1123_label(value, field=field))


class ConfigError(ValueError):
    """The configuration could not be used. ``problems`` holds one ``"<field path>: <what>"`` each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid kruntimes configuration:\n" + "\n".join(f"  {p}" for p in problems))
        self.problems = tuple(problems)


class ResourceLimits(ApiModel):
    """Limits applied to each function process on a host; unset ones keep the host's defaults."""

    openFiles: StrictInt | None = Field(default=None, ge=16)
    processes: StrictInt | None = Field(default=None, ge=1)
    addressSpaceBytes: StrictInt | None = Field(default=None, ge=16 * 1024 * 1024)
    cpuSeconds: StrictInt | None = Field(default=None, ge=1)
    fileSizeBytes: StrictInt | None = Field(default=None, ge=0)


class RuntimeConfig(ApiModel):
    """One runtime: its language adapter and the pool of hosts that serve it."""

    name: Annotated[str, _label("name")]
    adapter: Literal["python", "bash"]
    runs: StrictInt = Field(default=DEFAULT_RUNS, ge=1, le=MAX_RUNS_PER_HOST)
    minHosts: StrictInt = Field(default=0, ge=0, le=MAX_HOSTS_LIMIT)
    maxHosts: StrictInt = Field(default=DEFAULT_MAX_HOSTS, ge=1, le=MAX_HOSTS_LIMIT)
    provider: ProviderName = "process"
    # Idle time before a host beyond minHosts is drained and deleted.
    scaleInDelaySeconds: StrictFloat = Field(default=300.0, ge=0, le=DAY_SECONDS, allow_inf_nan=False)
    # How long a host may stay Assigned; it is deleted after twice this.
    assignmentTimeoutSeconds: StrictFloat = Field(default=60.0, gt=0, le=DAY_SECONDS, allow_inf_nan=False)
    # Invocation timeout when the caller names none.
    invokeTimeoutSeconds: StrictFloat = Field(
        default=float(DEFAULT_INVOKE_TIMEOUT_SECONDS),
        gt=0,
        le=MAX_INVOKE_TIMEOUT_SECONDS,
        allow_inf_nan=False,
    )
    limits: ResourceLimits | None = None
    # Each Run gets a fresh host of its own, deleted when the Run ends (its `runs` is taken as 1).
    oneshot: StrictBool = False

    @model_validator(mode="after")
    def _max_covers_min(self) -> Self:
        if self.maxHosts < self.minHosts:
            raise ValueError(f"maxHosts: must be >= minHosts ({self.minHosts}), got {self.maxHosts}")
        return self


class TenantConfig(ApiModel):
    """One tenant and its isolation settings (the fields of TenantPolicy, plus its name)."""

    name: Annotated[str, _label("name")]
    mode: TenancyMode = TenancyMode.Shared
    allowSharedFallback: StrictBool = False
    preferDedicatedCapacity: StrictBool = True
    group: Annotated[str, _label("group")] | None = None
    maxHosts: StrictInt | None = Field(default=None, ge=0, le=MAX_HOSTS_LIMIT)

    @model_validator(mode="after")
    def _valid_policy(self) -> Self:
        try:
            self.policy()
        except ValidationError as e:
            problems = [item["msg"].removeprefix("Value error, ") for item in e.errors(include_url=False)]
            raise ValueError("; ".join(problems)) from e
        return self

    def policy(self) -> TenantPolicy:
        return TenantPolicy.model_validate(self.model_dump(exclude={"name"}))


def _default_runtimes() -> list[RuntimeConfig]:
    return [RuntimeConfig(name="python", adapter="python"), RuntimeConfig(name="bash", adapter="bash")]


def _unique_names(items: list[RuntimeConfig] | list[TenantConfig], *, what: str) -> None:
    seen: set[str] = set()
    for item in items:
        if item.name in seen:
            raise ValueError(f"{what} names must be unique; {item.name!r} appears more than once")
        seen.add(item.name)


class PlatformConfig(ApiModel):
    runtimes: list[RuntimeConfig] = Field(default_factory=_default_runtimes, min_length=1)
    tenants: list[TenantConfig] = Field(default_factory=list)
    # Runs waiting for capacity, per runtime pool; beyond it admission rejects with QueueFull.
    queueLimit: StrictInt = Field(default=DEFAULT_QUEUE_LIMIT, ge=0, le=MAX_QUEUE_LIMIT)
    heartbeatIntervalSeconds: StrictFloat = Field(default=5.0, gt=0, le=3600.0, allow_inf_nan=False)
    # How often each runtime's reconciler looks for orphans (and at every worker start); None:
    # only at worker start and when an operator asks (`krt hosts reconcile`).
    reconcileIntervalSeconds: StrictFloat | None = Field(
        default=60.0, ge=1.0, le=DAY_SECONDS, allow_inf_nan=False
    )

    @field_validator("runtimes")
    @classmethod
    def _unique_runtimes(cls, runtimes: list[RuntimeConfig]) -> list[RuntimeConfig]:
        _unique_names(runtimes, what="runtime")
        return runtimes

    @field_validator("tenants")
    @classmethod
    def _unique_tenants(cls, tenants: list[TenantConfig]) -> list[TenantConfig]:
        _unique_names(tenants, what="tenant")
        return tenants

    def runtime(self, name: str) -> RuntimeConfig | None:
        return next((r for r in self.runtimes if r.name == name), None)

    def tenant_policy(self, tenant: str | None) -> TenantPolicy | None:
        """The policy for a Run's tenant: SHARED_POLICY without one, None for an unknown name.

        An unknown tenant is refused (TenantNotAllowed), never guessed to be Shared: a misspelt
        Dedicated tenant must not land on shared capacity.
        """
        if tenant is None:
            return SHARED_POLICY
        return next((t.policy() for t in self.tenants if t.name == tenant), None)


def _problems(error: ValidationError) -> list[str]:
    problems = []
    for item in error.errors(include_url=False):
        path = ".".join(str(part) for part in item["loc"]) or "<config>"
        message = item["msg"].removeprefix("Value error, ")
        prefix, sep, rest = message.partition(": ")
        if sep and (path == prefix or path.endswith(f".{prefix}")):
            message = rest
        elif sep and " " not in prefix and prefix.isidentifier():
            # A model-level validator named the field: "maxHosts: must be ..." at "runtimes.0".
            path, message = f"{path}.{prefix}" if path != "<config>" else prefix, rest
        problems.append(f"{path}: {message}")
    return problems


def parse_config(data: object) -> PlatformConfig:
    """Validate decoded YAML; ``None`` (an empty file) gives the defaults."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"<config>: expected a mapping, got {type(data).__name__}"])
    try:
        return PlatformConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_problems(e)) from e


def load_config(path: str | os.PathLike[str] | None = None) -> PlatformConfig:
    """Read the platform configuration from a YAML file; None gives the defaults."""
    if path is None:
        return PlatformConfig()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"<config>: cannot read {os.fspath(path)!r}: {e}"]) from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError([f"<config>: not valid YAML: {e}"]) from e
    return parse_config(data)
