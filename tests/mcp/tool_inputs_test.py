"""What run_create and functions_apply refuse before anything is touched: a whole manifest with
fields beside it, and fields without a name or spec (no platform: the refusal comes first)."""

from __future__ import annotations

from typing import Any

import pytest

from kruntimes.mcp import tools
from kruntimes.mcp.errors import ToolError
from tests.sdk.stack import manifest


@pytest.mark.parametrize(
    ("tool", "what", "document"),
    [
        ("run_create", "Run", manifest("x")),
        ("functions_apply", "Function", {**manifest("x"), "kind": "Function"}),
    ],
)
async def test_a_manifest_with_fields_beside_it_and_fields_without_a_spec_are_refused(
    tool: str, what: str, document: dict[str, Any]
) -> None:
    spec = tools.BY_NAME[tool]
    both = spec.validate({"manifest": document, "name": "y", "labels": {"a": "b"}})
    with pytest.raises(ToolError, match=f"manifest takes the whole {what}; drop name, labels"):
        await spec.handler(both, None)  # type: ignore[arg-type]
    bare = spec.validate({"name": "y"})
    with pytest.raises(ToolError, match=r"^InvalidArguments: spec required \(or a whole manifest\)$"):
        await spec.handler(bare, None)  # type: ignore[arg-type]
