"""The Run manifest, and parsing it from YAML or a plain mapping."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import yaml

from kruntimes.api._base import ApiModel, validate_document
from kruntimes.api.spec import Metadata, RunSpec
from kruntimes.api.status import RunStatus

API_VERSION = "kruntimes.io/v1alpha1"
KIND = "Run"


class ManifestError(ValueError):
    """A manifest could not be parsed. ``problems`` holds one ``"<field path>: <what is wrong>"`` each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid Run manifest:\n" + "\n".join(f"  {p}" for p in problems))
        self.problems = tuple(problems)


def yaml_problem(error: yaml.YAMLError, *, where: str) -> str:
    """A YAML error in one line, at ``where:line:column`` (1-based) when the parser knows the place."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    if isinstance(error, yaml.MarkedYAMLError):
        what = str(error.problem or "syntax error") + (f" ({error.context})" if error.context else "")
    else:
        what = str(error).splitlines()[0] if str(error) else type(error).__name__
    at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark is not None else where
    return f"{at}: not valid YAML: {what}"


def _below(path: str, name: str) -> str | None:
    # A model-level validator may name a field below it: "spec.mode: ..." at "spec".
    return name if name.startswith(f"{path}.") else None


class Run(ApiModel):
    apiVersion: Literal["kruntimes.io/v1alpha1"]
    kind: Literal["Run"]
    metadata: Metadata
    spec: RunSpec
    status: RunStatus | None = None

    @classmethod
    def from_dict(cls, data: object) -> Run:
        """Validate a decoded manifest; raises ManifestError listing every problem by field path."""
        return validate_document(cls, data, root="<manifest>", relocate=_below, error=ManifestError)

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
        **spec: object,
    ) -> Run:
        """A Run manifest built in code: the source inline (file name → content) or a directory
        `path`; any other spec field (mode, env, timeoutSeconds, ...) as a keyword. A function
        Run unless `mode` says otherwise; validated like a manifest (ManifestError)."""
        source: dict[str, object] = (
            {"path": path}
            if path is not None
            else {"inline": [{"name": n, "content": c} for n, c in (inline or {}).items()]}
        )
        metadata: dict[str, object] = {"name": name, "namespace": namespace}
        if uid is not None:
            metadata["uid"] = uid
        return cls.from_dict(
            {
                "apiVersion": API_VERSION,
                "kind": "Run",
                "metadata": metadata,
                "spec": {
                    "mode": {"function": {}},
                    **spec,
                    "runtime": runtime,
                    "handler": handler,
                    "source": source,
                },
            }
        )

    @classmethod
    def from_yaml(cls, text: str, *, filename: str = "<manifest>") -> Run:
        """Parse one YAML document holding a Run manifest (a YAML error names ``filename``, its
        line and column)."""
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ManifestError([yaml_problem(e, where=filename)]) from e
        return cls.from_dict(data)
