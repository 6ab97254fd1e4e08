"""The Function manifest: a function-mode Run's spec kept as a template, served by `scale`
replicas (function-mode Runs its workflow owns) behind one URL that carries the Function's uid.

A Function's status is what its FunctionWorkflow's ``status`` query returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Literal, Self

import yaml
from pydantic import AwareDatetime, Field, field_validator, model_validator

from kruntimes.api._base import ApiModel, StatusMessage, StrictInt, validate_document
from kruntimes.api.limits import (
    MAX_CONDITIONS,
    MAX_FUNCTION_CONCURRENCY,
    MAX_FUNCTION_NAME_CHARS,
    MAX_FUNCTION_REPLICAS,
    MAX_SCALE_DOWN_DELAY_SECONDS,
)
from kruntimes.api.run import API_VERSION, ManifestError, yaml_problem
from kruntimes.api.spec import Metadata, RunSpec
from kruntimes.api.status import Condition, Endpoint

FUNCTION_KIND = "Function"
# spec.scale.stableWindowSeconds: Knative's bounds (a panic window of a tenth of it stays >= 0.6 s).
MIN_STABLE_WINDOW_SECONDS = 6
MAX_STABLE_WINDOW_SECONDS = 3600


class FunctionManifestError(ManifestError):
    """A Function manifest could not be parsed (a ManifestError: whoever catches a Run's catches it)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(problems)
        self.args = ("invalid Function manifest:\n" + "\n".join(f"  {p}" for p in problems),)


class ScaleSpec(ApiModel):
    """How many replicas serve the Function: between ``min`` and ``max``, each taking up to
    ``targetConcurrency`` invocations before another is wanted (unset: the replica's own
    concurrency), scaled down only after ``scaleDownDelaySeconds`` of lower load. The load is
    averaged over ``stableWindowSeconds`` (a tenth of it is the panic window that answers a load
    step: kruntimes.decisions.autoscale)."""

    min: StrictInt = Field(default=1, ge=0, le=MAX_FUNCTION_REPLICAS)
    max: StrictInt = Field(default=10, ge=1, le=MAX_FUNCTION_REPLICAS)
    targetConcurrency: StrictInt | None = Field(default=None, ge=1, le=MAX_FUNCTION_CONCURRENCY)
    scaleDownDelaySeconds: StrictInt = Field(default=30, ge=0, le=MAX_SCALE_DOWN_DELAY_SECONDS)
    stableWindowSeconds: StrictInt = Field(
        default=60, ge=MIN_STABLE_WINDOW_SECONDS, le=MAX_STABLE_WINDOW_SECONDS
    )

    @model_validator(mode="after")
    def _min_within_max(self) -> Self:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be at most max ({self.max})")
        return self


# The revision a traffic target names for "the current one, whichever it is".
LATEST_REVISION = 0
# Revisions a split may name: the current one and the previous (the templates a Function keeps).
MAX_TRAFFIC_TARGETS = 2


class TrafficTarget(ApiModel):
    """A share of the Function's invocations for one revision: `revision: 0` is the current one
    (latest), any other number a revision the Function keeps (the current or the previous)."""

    revision: StrictInt = Field(ge=0)
    percent: StrictInt = Field(ge=0, le=100)


class FunctionSpec(RunSpec):
    """A function-mode Run's spec (the replicas' template), how many replicas serve it, and how
    the gateways split its invocations between two revisions (`traffic`; unset: all to the
    current revision, the older one's replicas deleted once it is rolled out)."""

    scale: ScaleSpec = Field(default_factory=ScaleSpec)
    traffic: list[TrafficTarget] | None = Field(default=None, min_length=1, max_length=MAX_TRAFFIC_TARGETS)

    @model_validator(mode="after")
    def _serves_invocations(self) -> Self:
        if self.mode.function is None:
            raise ValueError("spec.mode: a Function serves invocations: mode.function, not mode.task")
        return self

    @model_validator(mode="after")
    def _traffic_adds_up(self) -> Self:
        if self.traffic is None:
            return self
        revisions = [t.revision for t in self.traffic]
        if len(set(revisions)) != len(revisions):
            raise ValueError(f"spec.traffic: each revision at most once, not {revisions}")
        total = sum(t.percent for t in self.traffic)
        if total != 100:
            raise ValueError(f"spec.traffic: the percents must add up to 100, not {total}")
        return self

    def split(self, current: int) -> dict[int, int]:
        """`traffic` with `latest` (0) as the `current` revision's number: revision → percent ({}:
        every invocation to the current revision). Two targets naming the same revision add up."""
        if self.traffic is None:
            return {}
        shares: dict[int, int] = {}
        for target in self.traffic:
            revision = current if target.revision == LATEST_REVISION else target.revision
            shares[revision] = shares.get(revision, 0) + target.percent
        return {} if shares == {current: 100} else shares

    def template(self) -> RunSpec:
        """The spec every replica Run of this revision is created with (the spec without `scale`)."""
        return RunSpec.model_validate({name: getattr(self, name) for name in RunSpec.model_fields})

    def same_template(self, other: FunctionSpec) -> bool:
        """Whether `other` makes the same replicas (a change of `scale` or `traffic` alone is no
        new revision)."""
        return self.template() == other.template()

    @property
    def target_concurrency(self) -> int:
        """Invocations one replica should take before another is wanted (the autoscaler's unit)."""
        if self.scale.targetConcurrency is not None:
            return self.scale.targetConcurrency
        function = self.mode.function
        return (function.concurrency if function is not None else None) or 1


class FunctionPhase(StrEnum):
    """Pending: coming up, never Ready yet; Ready: as many replicas Ready as wanted (during a
    rollout, of either revision); Degraded: fewer, after the Function was Ready; Deleting: its
    replicas are being deleted; Deleted: they are, and the workflow has ended."""

    Pending = "Pending"
    Ready = "Ready"
    Degraded = "Degraded"
    Deleting = "Deleting"
    Deleted = "Deleted"


class FunctionConditionType(StrEnum):
    Ready = "Ready"  # every wanted replica of the current revision is Ready
    Progressing = "Progressing"  # a rollout: True while a new revision's replicas come up
    ReplicaFailure = "ReplicaFailure"  # True while replicas end before Ready: why, and the backoff


class ReplicaCounts(ApiModel):
    wanted: StrictInt = Field(default=0, ge=0, le=MAX_FUNCTION_REPLICAS)
    # Ready replicas of the current revision.
    ready: StrictInt = Field(default=0, ge=0)
    # Every replica the Function owns now, of any revision and phase (a rollout has more).
    total: StrictInt = Field(default=0, ge=0)


class ScaleEvent(ApiModel):
    """A change of the replicas wanted that the Function made itself: the autoscaler's decision,
    or a wake (an invocation held at a gateway while no replica serves)."""

    previous: StrictInt = Field(ge=0)
    wanted: StrictInt = Field(ge=0)
    reason: StatusMessage = ""
    message: StatusMessage = ""
    at: AwareDatetime


class FunctionStatus(ApiModel):
    phase: FunctionPhase = FunctionPhase.Pending
    # The current revision: 1 at creation, one more for each template change and each rollback.
    revision: StrictInt = Field(default=0, ge=0)
    # The latest revision whose wanted replicas were all Ready (revision == observedRevision: the
    # rollout is done, the older revisions' replicas are deleted or being deleted).
    observedRevision: StrictInt = Field(default=0, ge=0)
    replicas: ReplicaCounts = Field(default_factory=ReplicaCounts)
    # The Function's invoke URL: the same for every revision and replica.
    endpoint: Endpoint | None = None
    conditions: list[Condition] = Field(default_factory=list, max_length=MAX_CONDITIONS)
    message: StatusMessage = ""
    # The last change of `replicas.wanted` the Function made itself (the autoscaler, a wake).
    lastScale: ScaleEvent | None = None
    # The split the gateways honour, `latest` resolved to a number (empty: all to `revision`).
    traffic: list[TrafficTarget] = Field(default_factory=list, max_length=MAX_TRAFFIC_TARGETS)

    @field_validator("conditions")
    @classmethod
    def _one_condition_per_type(cls, conditions: list[Condition]) -> list[Condition]:
        types = [c.type for c in conditions]
        if len(set(types)) != len(types):
            raise ValueError("status.conditions must hold at most one condition per type")
        return conditions

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    def with_condition(self, cond: Condition) -> FunctionStatus:
        """A copy with ``cond`` replacing the condition of its type (lastTransitionTime kept when
        its status does not change)."""
        old = self.condition(cond.type)
        if old is None:
            return self._replace(conditions=[*self.conditions, cond])
        if old.status == cond.status:
            cond = cond._replace(lastTransitionTime=old.lastTransitionTime)
        return self._replace(conditions=[cond if c.type == cond.type else c for c in self.conditions])


def _below(path: str, name: str) -> str | None:
    return name if name.startswith(f"{path}.") else None


class Function(ApiModel):
    apiVersion: Literal["kruntimes.io/v1alpha1"]
    kind: Literal["Function"]
    metadata: Metadata
    spec: FunctionSpec
    status: FunctionStatus | None = None

    @field_validator("metadata")
    @classmethod
    def _name_leaves_room_for_replicas(cls, metadata: Metadata) -> Metadata:
        # A replica Run's name is `<function>-r<revision>-<5 hex>`: a DNS-1123 label too.
        if len(metadata.name) > MAX_FUNCTION_NAME_CHARS:
            raise ValueError(
                f"metadata.name: a Function name is at most {MAX_FUNCTION_NAME_CHARS} characters "
                f"(its replicas' Run names add a revision and a suffix): {metadata.name!r:.80}"
            )
        return metadata

    @classmethod
    def from_dict(cls, data: object) -> Function:
        """Validate a decoded manifest; raises FunctionManifestError (a ManifestError) listing
        every problem by field path."""
        return validate_document(cls, data, root="<manifest>", relocate=_below, error=FunctionManifestError)

    @classmethod
    def new(
        cls,
        name: str,
        *,
        runtime: str,
        handler: str,
        inline: Mapping[str, str] | None = None,
        path: str | None = None,
        namespace: str = "default",
        uid: str | None = None,
        scale: Mapping[str, object] | None = None,
        **spec: object,
    ) -> Function:
        """A Function manifest built in code, as `Run.new` builds a Run: the source inline (file
        name → content) or a directory `path`, `scale` as a mapping, any other spec field as a
        keyword; validated like a manifest (FunctionManifestError)."""
        source: dict[str, object] = (
            {"path": path}
            if path is not None
            else {"inline": [{"name": n, "content": c} for n, c in (inline or {}).items()]}
        )
        metadata: dict[str, object] = {"name": name, "namespace": namespace}
        if uid is not None:
            metadata["uid"] = uid
        body: dict[str, object] = {"mode": {"function": {}}, **spec}
        if scale is not None:
            body["scale"] = dict(scale)
        return cls.from_dict(
            {
                "apiVersion": API_VERSION,
                "kind": FUNCTION_KIND,
                "metadata": metadata,
                "spec": {**body, "runtime": runtime, "handler": handler, "source": source},
            }
        )

    @classmethod
    def from_yaml(cls, text: str, *, filename: str = "<manifest>") -> Function:
        """Parse one YAML document holding a Function manifest (a YAML error names ``filename``,
        its line and column)."""
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise FunctionManifestError([yaml_problem(e, where=filename)]) from e
        return cls.from_dict(data)
