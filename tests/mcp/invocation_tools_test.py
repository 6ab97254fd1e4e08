"""`krt mcp`'s async invocation tools without a platform: what their inputs take and what the
access check is asked for (a Run's or, with `function`, a Function's `get`, as a sync invoke)."""

from __future__ import annotations

import pytest

from kruntimes.mcp import tools
from kruntimes.mcp.access import FUNCTIONS, RUNS, Target
from kruntimes.mcp.errors import ToolError


@pytest.mark.parametrize("tool", ["invoke_async", "invocation_get"])
def test_an_invocation_tool_asks_for_get_on_its_run_or_with_function_on_its_function(tool: str) -> None:
    spec = tools.BY_NAME[tool]
    base = {"name": "hello", "namespace": "team"} | (
        {"invocationId": "a"} if tool == "invocation_get" else {}
    )
    assert tools.target_of(spec, spec.validate(base)) == Target("team", "hello", RUNS, ("get",))
    as_function = spec.validate({**base, "function": True})
    assert tools.target_of(spec, as_function) == Target("team", "hello", FUNCTIONS, ("get",))
    assert not spec.mutating


def test_invocation_get_needs_a_printable_id_and_bounds_its_wait() -> None:
    spec = tools.BY_NAME["invocation_get"]
    with pytest.raises(ToolError, match="invocationId"):
        spec.validate({"name": "hello"})
    with pytest.raises(ToolError, match="printable ASCII"):
        spec.validate({"name": "hello", "invocationId": "caf\u00e9"})
    with pytest.raises(ToolError, match="waitSeconds"):
        spec.validate({"name": "hello", "invocationId": "a", "waitSeconds": tools.MAX_WAIT_S + 1})
