"""The FunctionConfig kind: which binaries and pods serve which function images.

    apiVersion: kruntimes.io/v1alpha1
    kind: FunctionConfig
    metadata: {name: set-labels, namespace: kruntimes}
    spec:
      prefixes: [ghcr.io/kptdev/krm-functions-catalog/set-labels]   # image names, without tag
      binaryExecutor:
        path: set-labels            # absolute, or relative to the runner's --functions directory
        tags: [">=0.2.0 <0.3.0", v0.1.5]   # semver constraints (a version is one too)
      podExecutor:                  # the pod evaluator: function-mode Runs of the krm runtime
        tags: [v0.2.1]
        ttl: 30m                    # the Runs' idle timeout: seconds, or 90s, 30m, 1h30m
        maxParallel: 2
        maxWaitlist: 4
        maxConcurrentEvaluations: 8 # evaluations one Run takes at once
        # templateOverrides is refused: a function's pods are its runtime's (see PodExecutor)
        source: {path: /fns/set-labels, entrypoint: [python, main.py]}   # embedded mode
        # cluster mode instead of source: the program in the function's own image, on Runs of a
        # krm runtime whose host pods are of that image (kubernetes.hostInjection)
        # entrypoint: [/usr/local/bin/function]
        # runtime: krm-set-labels   # that runtime (default: the evaluator's --pod-runtime)

An image matches a FunctionConfig when its name (the reference without tag or digest) equals one
of the prefixes. Validation errors name the field: `spec.binaryExecutor.tags[0]: ...`.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kruntimes.krm import tags
from kruntimes.krm.evaluation import check_image
from kruntimes.krm.resources import describe

API_VERSION = "kruntimes.io/v1alpha1"
KIND = "FunctionConfig"
GROUP, VERSION, PLURAL = "kruntimes.io", "v1alpha1", "functionconfigs"

MAX_PREFIXES = 32
_RUNTIME_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # a DNS-1123 label
MAX_TAGS = 64
MAX_TTL_SECONDS = 7 * 24 * 3600
_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class FunctionConfigError(ValueError):
    """A FunctionConfig document is invalid; the message names the source and the field."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_tags(values: list[str]) -> list[str]:
    for index, value in enumerate(values):
        try:
            tags.parse_constraint(value)
        except tags.ConstraintError as e:
            raise ValueError(f"[{index}] {value!r} is not a semver constraint: {e}") from e
    return values


class BinaryExecutor(_Spec):
    path: str = Field(min_length=1, max_length=4096)
    tags: list[str] = Field(min_length=1, max_length=MAX_TAGS)

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if "\x00" in value or not value.isprintable():
            raise ValueError("must be printable, without NUL")
        return value

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: list[str]) -> list[str]:
        return _check_tags(value)


class InlineFile(_Spec):
    name: str = Field(min_length=1, max_length=255)
    content: str
    executable: bool = False


class PodSource(_Spec):
    """Embedded mode: the function's program, registered as the source of its Runs; `entrypoint`
    is its argv (the program absolute, or a file of the source)."""

    path: str | None = None
    inline: list[InlineFile] | None = None
    entrypoint: list[str] = Field(min_length=1, max_length=64)

    @model_validator(mode="after")
    def _one(self) -> PodSource:
        if (self.path is None) == (self.inline is None):
            raise ValueError("give exactly one of path and inline")
        return self


# A function's Runs run on the hosts of its krm runtime, which the runtimes file describes (and
# other functions' Runs share): a FunctionConfig may not change their pods (securityContext,
# volumes and service account included), so an override would have no effect or too much.
TEMPLATE_OVERRIDES = (
    "not supported: a function's pods are its krm runtime's hosts; set their resources in the "
    "runtimes file (the runtime's kubernetes.podTemplate, or limits) and name that runtime in "
    "podExecutor.runtime"
)


class PodExecutor(_Spec):
    tags: list[str] = Field(default_factory=list, max_length=MAX_TAGS)
    ttl: float = Field(default=1800.0, gt=0, le=MAX_TTL_SECONDS)
    maxParallel: int = Field(default=1, ge=1, le=64)
    maxWaitlist: int = Field(default=8, ge=0, le=1024)
    # evaluations one Run takes at once (each its own process on the host); at most the krm
    # runtime's hosts' `--krm-concurrency`
    maxConcurrentEvaluations: int = Field(default=8, ge=1, le=64)
    # Refused when given (TEMPLATE_OVERRIDES says why): kept so the error names the field.
    templateOverrides: Any = None
    # Embedded mode: the program its Runs run, registered as their source.
    source: PodSource | None = None
    # Cluster mode: the function's argv in its own image (the program absolute), run on a krm
    # runtime whose host pods are of that image (`kubernetes.hostInjection`).
    entrypoint: list[str] | None = Field(default=None, min_length=1, max_length=64)
    # The krm runtime its Runs use; None: the evaluator's (`--pod-runtime`, default krm).
    runtime: str | None = Field(
        default=None, min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    )

    @model_validator(mode="after")
    def _one_program(self) -> PodExecutor:
        if self.source is not None and self.entrypoint is not None:
            raise ValueError("give source (embedded mode) or entrypoint (cluster mode), not both")
        if self.entrypoint is not None and not self.entrypoint[0].startswith("/"):
            raise ValueError("entrypoint: the program in the function's image must be an absolute path")
        return self

    @property
    def runnable(self) -> bool:
        """Whether the pod evaluator has a program to run: a source, or an entrypoint in the image."""
        return self.source is not None or self.entrypoint is not None

    @field_validator("templateOverrides", mode="before")
    @classmethod
    def _no_template_overrides(cls, value: Any) -> Any:
        raise ValueError(TEMPLATE_OVERRIDES)

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: list[str]) -> list[str]:
        return _check_tags(value)

    @field_validator("ttl", mode="before")
    @classmethod
    def _ttl(cls, value: Any) -> Any:
        if isinstance(value, str):
            match = _DURATION.match(value.strip())
            if not value.strip() or match is None:
                raise ValueError(f"{value!r} is not seconds or a duration such as 90s, 30m, 1h30m")
            h, m, s = (int(g or 0) for g in match.groups())
            return h * 3600 + m * 60 + s
        return value


class Metadata(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    name: str
    namespace: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("must be a DNS subdomain name (lowercase letters, digits, '-', '.')")
        return value


class FunctionConfigSpec(_Spec):
    prefixes: list[str] = Field(min_length=1, max_length=MAX_PREFIXES)
    binaryExecutor: BinaryExecutor | None = None
    podExecutor: PodExecutor | None = None

    @field_validator("prefixes")
    @classmethod
    def _prefixes(cls, value: list[str]) -> list[str]:
        for index, prefix in enumerate(value):
            try:
                check_image(prefix)
            except Exception as e:
                raise ValueError(f"[{index}] {e}") from e
            if tags.split_image(prefix) != (prefix, "") or "@" in prefix:
                raise ValueError(f"[{index}] {prefix!r}: a prefix is an image name without tag or digest")
        return value


class FunctionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    apiVersion: Literal["kruntimes.io/v1alpha1"]
    kind: Literal["FunctionConfig"]
    metadata: Metadata
    spec: FunctionConfigSpec
    status: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        namespace = self.metadata.namespace
        return f"{namespace}/{self.metadata.name}" if namespace else self.metadata.name


def parse(document: Any, *, source: str) -> FunctionConfig:
    """A FunctionConfig from one parsed YAML/JSON document; FunctionConfigError names `source`
    and the field."""
    if not isinstance(document, dict):
        raise FunctionConfigError(f"{source}: a FunctionConfig is a mapping, not {type(document).__name__}")
    try:
        return FunctionConfig.model_validate(document)
    except ValidationError as e:
        raise FunctionConfigError(f"{source}: {describe(e)}") from e
