"""The base model, the small annotated types the API models share, and their problems in words."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, Self, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Strict, ValidationError

from kruntimes.api._text import truncate_utf8
from kruntimes.api.limits import MAX_STATUS_MESSAGE_BYTES

# Strict numbers: a YAML `true` or "30" is an error, not 1 or 30.
StrictInt = Annotated[int, Strict()]
StrictFloat = Annotated[float, Strict()]
StrictBool = Annotated[bool, Strict()]


def _bound_message(value: str) -> str:
    return truncate_utf8(value, max_bytes=MAX_STATUS_MESSAGE_BYTES)


# Human-readable status text: truncated on a UTF-8 boundary (with "…"), never rejected for length.
StatusMessage = Annotated[str, AfterValidator(_bound_message)]


class ApiModel(BaseModel):
    """Frozen, closed-world models whose attribute names are the manifest's camelCase field names."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def _replace(self, **changes: Any) -> Self:
        """A validated copy with some fields replaced (``model_copy(update=...)`` skips validation)."""
        values = {name: getattr(self, name) for name in type(self).model_fields}
        return self.model_validate({**values, **changes})


def validation_problems(
    error: ValidationError, *, root: str, relocate: Callable[[str, str], str | None]
) -> list[str]:
    """Each error of ``error`` as ``"<field path>: <what is wrong>"`` (``root``: the document
    itself). A validator's message that starts with a field name ("name: ...") loses the name
    where the path already ends in it; else ``relocate(path, name)`` may give the path the
    message is about instead (None: path and message stay as they are)."""
    problems = []
    for item in error.errors(include_url=False):
        path = ".".join(str(part) for part in item["loc"]) or root
        message = item["msg"].removeprefix("Value error, ")
        prefix, sep, rest = message.partition(": ")
        if sep and (path == prefix or path.endswith(f".{prefix}")):
            message = rest
        elif sep and (moved := relocate(path, prefix)) is not None:
            path, message = moved, rest
        problems.append(f"{path}: {message}")
    return problems


M = TypeVar("M", bound=BaseModel)


def validate_document(
    model: type[M],
    data: object,
    *,
    root: str,
    relocate: Callable[[str, str], str | None],
    error: Callable[[list[str]], Exception],
) -> M:
    """A decoded document (``data``) as ``model``; else ``error(problems)`` is raised with every
    problem by field path, as validation_problems words them (``root``: the document itself)."""
    if not isinstance(data, Mapping):
        raise error([f"{root}: expected a mapping, got {type(data).__name__}"])
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise error(validation_problems(e, root=root, relocate=relocate)) from e
