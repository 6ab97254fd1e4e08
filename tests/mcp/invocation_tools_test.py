"""`krt mcp`'s async invocation tools: what their inputs take and what the access check is asked
for (a Run's or, with `function`, a Function's `get`, as a sync invoke); over HTTPS against the
shared platform, the submission carries the caller's own token to the gateway."""

from __future__ import annotations

import json

import pytest

from kruntimes.mcp import tools
from kruntimes.mcp.access import FUNCTIONS, RUNS, Target
from kruntimes.mcp.errors import ToolError
from tests.mcp.conftest import ADMIN_TOKEN, CAROL_TOKEN, HttpServer, refusal, structured
from tests.sdk.stack import Platform, manifest, unique


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


async def test_over_https_an_async_invocation_is_the_callers_and_is_read_until_it_ends(
    platform: Platform, mcp_http: HttpServer
) -> None:
    """The gateway binds carol nowhere: her submission through MCP is its refusal, for her; the
    admin's is accepted and read back, waited for, through the same tool."""
    name = unique("mcp-async")
    async with mcp_http.session(CAROL_TOKEN) as carol, mcp_http.session(ADMIN_TOKEN) as admin:
        created = await admin.call_tool(
            "run_create", {"manifest": manifest(name, namespace="team-b"), "wait": True}
        )
        assert structured(created)["status"]["phase"] == "Ready"
        arguments = {"name": name, "namespace": "team-b", "data": {"by": "mcp"}, "invocationId": "mcp-1"}
        refused = refusal(await carol.call_tool("invoke_async", arguments))
        assert refused["reason"] == "Forbidden", refused
        accepted = structured(await admin.call_tool("invoke_async", arguments))
        assert accepted["invocationId"] == "mcp-1" and accepted["location"].endswith("/invocations/mcp-1")
        done = structured(
            await admin.call_tool(
                "invocation_get",
                {"name": name, "namespace": "team-b", "invocationId": "mcp-1", "waitSeconds": 60},
            )
        )
        assert done["state"] == "Succeeded" and '"by":"mcp"' in json.dumps(done["result"]).replace(" ", "")
        structured(await admin.call_tool("run_delete", {"name": name, "namespace": "team-b"}))
    assert CAROL_TOKEN not in mcp_http.log.read_text() and ADMIN_TOKEN not in mcp_http.log.read_text()
