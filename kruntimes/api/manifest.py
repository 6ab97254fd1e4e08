"""A manifest of either kind (`krt apply -f`): a Run or a Function, told apart by its `kind`."""

from __future__ import annotations

import yaml

from kruntimes.api.function import FUNCTION_KIND, Function
from kruntimes.api.run import KIND, ManifestError, Run, yaml_problem

KINDS = (KIND, FUNCTION_KIND)


def manifest_from_dict(data: object) -> Run | Function:
    """A decoded manifest as the model its `kind` names; ManifestError listing every problem."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind == FUNCTION_KIND:
        return Function.from_dict(data)
    if kind == KIND or not isinstance(data, dict):
        return Run.from_dict(data)
    raise ManifestError([f"kind: expected one of {', '.join(KINDS)}, got {kind!r:.80}"])


def load_manifest(text: str, *, filename: str = "<manifest>") -> Run | Function:
    """Parse one YAML document holding a Run or a Function manifest (a YAML error names
    ``filename``, its line and column)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ManifestError([yaml_problem(e, where=filename)]) from e
    return manifest_from_dict(data)
