"""The base model and the small annotated types the API models share."""

from __future__ import annotations

from typing import Annotated, Any, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Strict

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
